import { describe, expect, it } from "vitest";
import { createLogger } from "./log.js";

describe("node agent log", () => {
  it("writes one JSON object per line and never prints secret-named fields", () => {
    const lines: string[] = [];
    const log = createLogger("node-agent", { write: (line) => lines.push(line) }).child({ sandboxId: "abc" });
    log.info("sandbox created", { envdAccessToken: "s3cret", trafficToken: "t0k", password: "p", exec: "e1" });
    expect(lines).toHaveLength(1);
    expect(lines[0]).not.toMatch(/s3cret|t0k|"p"/);
    expect(JSON.parse(lines[0]!)).toMatchObject({
      level: "info",
      msg: "sandbox created",
      sandboxId: "abc",
      exec: "e1",
    });
  });
});
