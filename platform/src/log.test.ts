import { describe, expect, it } from "vitest";
import { createLogger } from "./log.js";

function collect() {
  const lines: Record<string, unknown>[] = [];
  return { lines, write: (line: string) => lines.push(JSON.parse(line)) };
}

describe("createLogger", () => {
  it("writes one JSON object per line with time, level, component, message and the given fields", () => {
    const { lines, write } = collect();
    createLogger("envd", { write }).info("started", { port: 49983 });
    expect(lines).toEqual([
      { time: expect.any(String), level: "info", component: "envd", msg: "started", port: 49983 },
    ]);
  });

  it("drops every field named like a secret, whichever component logs it", () => {
    const { lines, write } = collect();
    const secrets = {
      accessToken: "t",
      API_KEY: "k",
      apiKey: "k",
      "x-api-key": "k",
      password: "p",
      passwd: "p",
      authorization: "a",
      cookie: "c",
      signature: "s",
      clientSecret: "s",
      registryCredentials: "c",
      envVars: { A: "1" },
    };
    createLogger("proxy", { write }).warn("request", { sandboxId: "abc", ...secrets });
    expect(lines[0]).toMatchObject({ sandboxId: "abc" });
    for (const name of Object.keys(secrets)) expect(lines[0]).not.toHaveProperty(name);
  });

  it("prints an Error as its message, not {}", () => {
    const { lines, write } = collect();
    createLogger("master", { write }).error("failed", { error: new Error("disk full") });
    expect(lines[0]?.error).toBe("disk full");
  });

  it("skips lines below its level and carries a child's fields on every line", () => {
    const { lines, write } = collect();
    const log = createLogger("node-agent", { write, level: "info", base: { nodeId: "n1" } }).child({ sandboxId: "s" });
    log.debug("noise");
    log.info("created");
    expect(lines).toEqual([expect.objectContaining({ msg: "created", nodeId: "n1", sandboxId: "s" })]);
  });
});
