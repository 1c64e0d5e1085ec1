import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  prewarmsDone,
  RouteWriter,
  randomSandboxId,
  send,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
  waitForPrewarms,
} from "./harness.js";

// This file's own route events, so the prewarm counts are of its routes alone.
const PREFIX = `prewarm-${randomBytes(4).toString("hex")}:`;
let routes: RouteWriter;
/** Stands in for a sandbox's envd; records each request's method and path with its connection's number. */
let envd: Upstream;
let requests: string[] = [];

beforeAll(async () => {
  routes = new RouteWriter(PREFIX);
  let connection = 0;
  envd = await startUpstream(
    (req, res) => {
      requests.push(`${(req.socket as { n?: number } & typeof req.socket).n} ${req.method} ${req.url}`);
      res.writeHead(req.url === "/health" ? 204 : 200).end(req.url === "/health" ? undefined : "ok");
    },
    (server) => server.on("connection", (socket) => Object.assign(socket, { n: ++connection })),
  );
});
afterAll(async () => {
  await envd.close();
  await routes.cleanup();
});

function viaHeaders(sandboxId: string) {
  return { "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": "49983" };
}

describe("PROXY_PREWARM_ENVD", () => {
  let proxy: TestProxy;
  afterAll(() => proxy?.close());

  it("opens a connection to a new sandbox's envd before its first request, which then takes it", async () => {
    proxy = await startTestProxy({ WARREN_REDIS_PREFIX: PREFIX, PROXY_PREWARM_ENVD: "true" });
    requests = [];
    const sandboxId = randomSandboxId();
    const before = envd.connections();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "49983": `127.0.0.1:${envd.port}` } });
    await waitForPrewarms(proxy, 1);
    expect(await prewarmsDone(proxy, "opened")).toBe(1);
    // Before any client asked: one connection, one GET /health on it.
    expect(envd.connections() - before).toBe(1);
    expect(requests).toHaveLength(1);
    const [connection] = (requests[0] ?? "").split(" ");
    expect(requests[0]).toBe(`${connection} GET /health`);

    const reply = await send(proxy.port, {
      path: "/process.Process/List",
      method: "POST",
      headers: viaHeaders(sandboxId),
    });
    expect(reply).toMatchObject({ status: 200, body: "ok" });
    // The client's request went over the prewarmed connection: no new one.
    expect(envd.connections() - before).toBe(1);
    expect(requests[1]).toBe(`${connection} POST /process.Process/List`);
  });

  it("leaves paused sandboxes alone", async () => {
    const sandboxId = randomSandboxId();
    const done = await prewarmsDone(proxy);
    const before = envd.connections();
    await routes.write({
      sandboxId,
      sandboxAddr: "127.0.0.1",
      state: "paused",
      ports: { "49983": `127.0.0.1:${envd.port}` },
    });
    // A paused route's event is not one to prewarm on: nothing is counted, nothing connects.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await prewarmsDone(proxy)).toBe(done);
    expect(envd.connections()).toBe(before);
  });

  it("counts a sandbox whose envd does not answer as failed and keeps no pool for it", async () => {
    const sandboxId = randomSandboxId();
    const failed = await prewarmsDone(proxy, "failed");
    const done = await prewarmsDone(proxy);
    // Nothing listens on the mapped port (the stand-in was never started there).
    const closed = await startUpstream(() => undefined);
    const port = closed.port;
    await closed.close();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "49983": `127.0.0.1:${port}` } });
    await waitForPrewarms(proxy, done + 1);
    expect(await prewarmsDone(proxy, "failed")).toBe(failed + 1);
    const reply = await send(proxy.port, { path: "/health", headers: viaHeaders(sandboxId) });
    expect(reply.status).toBe(502);
  });

  it("does nothing when turned off", async () => {
    await proxy.close(); // the proxy with prewarms on would connect to this route's envd
    const off = await startTestProxy({ WARREN_REDIS_PREFIX: PREFIX, PROXY_PREWARM_ENVD: "false" });
    try {
      const sandboxId = randomSandboxId();
      const before = envd.connections();
      await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "49983": `127.0.0.1:${envd.port}` } });
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(await prewarmsDone(off)).toBe(0);
      expect(envd.connections()).toBe(before);
    } finally {
      await off.close();
    }
  });
});
