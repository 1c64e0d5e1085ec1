import { createServer, type Socket } from "node:net";
import { describe, expect, test } from "vitest";
import { ConnectionConfig, InvalidArgumentError, Sandbox, TimeoutError } from "../src/index.js";

describe("connection config", () => {
  test("host routing (the default without sandboxUrl) builds <port>-<id>.<domain> URLs", () => {
    const sandbox = new Sandbox({ sandboxId: "abc", envdVersion: "0.6.4", domain: "warren.example", apiKey: "k" });
    expect(sandbox.connectionConfig.apiUrl).toBe("https://api.warren.example");
    expect(sandbox.getHost(3000)).toBe("3000-abc.warren.example");
    expect(sandbox.ports.url(3000)).toBe("https://3000-abc.warren.example");
  });

  test("the domain the API returned for a sandbox wins over the configured one; insecure gives http", () => {
    const sandbox = new Sandbox({
      sandboxId: "abc",
      envdVersion: "0.6.4",
      sandboxDomain: "node7.example:8080",
      domain: "warren.example",
      insecure: true,
    });
    expect(sandbox.ports.url(8000)).toBe("http://8000-abc.node7.example:8080");
  });

  test("sandboxUrl switches to header routing: one origin, sandbox named by E2b-Sandbox-Id/-Port", () => {
    const sandbox = new Sandbox({ sandboxId: "abc", envdVersion: "0.6.4", sandboxUrl: "http://proxy.internal:8080/" });
    expect(sandbox.connectionConfig.routing).toBe("header");
    expect(sandbox.ports.url(49999)).toBe("http://proxy.internal:8080");
    expect(sandbox.ports.headers(49999)).toEqual({ "E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "49999" });
  });

  test("header routing without a sandboxUrl is refused with the reason", () => {
    expect(() => new ConnectionConfig({ routing: "header" })).toThrow(InvalidArgumentError);
  });

  test("WARREN_* environment variables configure the client, E2B_* ones too", () => {
    const names = ["E2B_API_URL", "WARREN_API_URL", "WARREN_API_KEY"] as const;
    const saved = names.map((name) => process.env[name]);
    try {
      process.env.E2B_API_URL = "http://e2b-api:1";
      process.env.WARREN_API_KEY = "wk";
      const config = new ConnectionConfig();
      expect(config.apiUrl).toBe("http://e2b-api:1");
      expect(config.apiKey).toBe("wk");
      process.env.WARREN_API_URL = "http://warren-api:2";
      expect(new ConnectionConfig().apiUrl).toBe("http://warren-api:2");
    } finally {
      names.forEach((name, i) => {
        if (saved[i] === undefined) delete process.env[name];
        else process.env[name] = saved[i];
      });
    }
  });

  test("a stream whose start event never comes fails with TimeoutError after requestTimeoutMs", async () => {
    const sockets: Socket[] = [];
    const blackhole = createServer((socket) => void sockets.push(socket));
    await new Promise<void>((resolve) => blackhole.listen(0, "127.0.0.1", resolve));
    const { port } = blackhole.address() as { port: number };
    try {
      const sandbox = new Sandbox({
        sandboxId: "abc",
        envdVersion: "0.6.4",
        sandboxUrl: `http://127.0.0.1:${port}`,
        requestTimeoutMs: 300,
      });
      await expect(sandbox.commands.run("true")).rejects.toBeInstanceOf(TimeoutError);
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => blackhole.close(() => resolve()));
    }
  });
});
