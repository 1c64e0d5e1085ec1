import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../src/config.js";
import {
  closedPort,
  nextRouteEvent,
  RouteWriter,
  randomSandboxId,
  send,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
} from "./harness.js";

// What a deployment shares with others on one Redis (WARREN_REDIS_PREFIX) and what it serves besides
// sandboxes (api.<domain> with PROXY_API_URL).

describe("two deployments with their own WARREN_REDIS_PREFIX on one Redis", () => {
  const prefixA = `wt-${randomBytes(4).toString("hex")}:`;
  const prefixB = `wt-${randomBytes(4).toString("hex")}:`;
  let writerA: RouteWriter;
  let writerB: RouteWriter;
  let proxyA: TestProxy;
  let proxyB: TestProxy;
  let unprefixed: TestProxy;
  let sandbox: Upstream;

  beforeAll(async () => {
    writerA = new RouteWriter(prefixA);
    writerB = new RouteWriter(prefixB);
    sandbox = await startUpstream((_req, res) => res.end("sandbox of A"));
    proxyA = await startTestProxy({ WARREN_REDIS_PREFIX: prefixA });
    proxyB = await startTestProxy({ WARREN_REDIS_PREFIX: prefixB });
    unprefixed = await startTestProxy();
  });

  afterAll(async () => {
    await Promise.all([proxyA.close(), proxyB.close(), unprefixed.close()]);
    await sandbox.close();
    await Promise.all([writerA.cleanup(), writerB.cleanup()]);
  });

  it("a route written under one prefix is served by that deployment's proxy only", async () => {
    const sandboxId = randomSandboxId();
    await writerA.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "8080": `127.0.0.1:${sandbox.port}` } });
    const host = `8080-${sandboxId}.warren.test`;
    expect(await send(proxyA.port, { host })).toMatchObject({ status: 200, body: "sandbox of A" });
    for (const other of [proxyB, unprefixed]) {
      const reply = await send(other.port, { host });
      expect(reply.status).toBe(502);
      expect(JSON.parse(reply.body)).toMatchObject({ message: "The sandbox was not found" });
    }
    const keys = await writerA.redis.call("KEYS", `*${sandboxId}`);
    expect(keys).toEqual([`${prefixA}warren:route:${sandboxId}`]);
  });

  it("the same sandbox id under two prefixes is two routes, and a kill event reaches only its own proxy", async () => {
    const sandboxId = randomSandboxId();
    const other = await startUpstream((_req, res) => res.end("sandbox of B"));
    try {
      const a = await writerA.write({
        sandboxId,
        sandboxAddr: "127.0.0.1",
        ports: { "8080": `127.0.0.1:${sandbox.port}` },
      });
      await writerB.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "8080": `127.0.0.1:${other.port}` } });
      const host = `8080-${sandboxId}.warren.test`;
      expect((await send(proxyA.port, { host })).body).toBe("sandbox of A");
      expect((await send(proxyB.port, { host })).body).toBe("sandbox of B");

      let leaked = false;
      const offB = proxyB.running.routes.onEvent((event) => {
        if (event.sandboxId === sandboxId && event.state === "deleted") leaked = true;
      });
      const seenByA = nextRouteEvent(proxyA, (event) => event.sandboxId === sandboxId && event.state === "deleted");
      await writerA.delete(sandboxId, a.exec);
      await seenByA;
      expect((await send(proxyA.port, { host })).status).toBe(502);
      expect((await send(proxyB.port, { host })).body).toBe("sandbox of B");
      offB();
      expect(leaked).toBe(false);
    } finally {
      await other.close();
    }
  });

  it("refuses a prefix with characters outside the contract's set", () => {
    expect(() => loadConfig({ WARREN_REDIS_PREFIX: "has space" })).toThrow(ConfigError);
    expect(loadConfig({ WARREN_REDIS_PREFIX: "team-1:" }).redisPrefix).toBe("team-1:");
    expect(loadConfig({}).redisPrefix).toBe("");
  });
});

describe("api.<domain> with PROXY_API_URL", () => {
  let api: Upstream;
  let proxy: TestProxy;
  let seen: {
    host?: string | undefined;
    url?: string | undefined;
    key?: string | undefined;
    proto?: string | undefined;
  } = {};

  beforeAll(async () => {
    api = await startUpstream((req, res) => {
      seen = {
        host: req.headers.host,
        url: req.url,
        key: req.headers["x-api-key"] as string | undefined,
        proto: req.headers["x-forwarded-proto"] as string | undefined,
      };
      if (req.url === "/stream") {
        res.writeHead(200, { "Content-Type": "text/event-stream" });
        res.write("data: one\n\n");
        setTimeout(() => res.end("data: two\n\n"), 50);
        return;
      }
      res.writeHead(201, { "Content-Type": "application/json" }).end('{"sandboxID":"x"}');
    });
    proxy = await startTestProxy({ PROXY_DOMAINS: "warren.test", PROXY_API_URL: `http://127.0.0.1:${api.port}` });
  });

  afterAll(async () => {
    await proxy.close();
    await api.close();
  });

  it("forwards api.<domain> to the api with method, path, headers and body, and streams the answer", async () => {
    const reply = await send(proxy.port, {
      host: "api.warren.test",
      method: "POST",
      path: "/v2/sandboxes?x=1",
      headers: { "X-API-KEY": "key-1", "Content-Type": "application/json" },
      body: '{"templateID":"base"}',
    });
    expect(reply).toMatchObject({ status: 201, body: '{"sandboxID":"x"}' });
    expect(seen).toEqual({ host: "api.warren.test", url: "/v2/sandboxes?x=1", key: "key-1", proto: "http" });
    const stream = await send(proxy.port, { host: "api.warren.test:443", path: "/stream" });
    expect(stream.body).toBe("data: one\n\ndata: two\n\n");
  });

  it("tells the api the scheme its client used on this listener (plain HTTP), not the one the client claims", async () => {
    await send(proxy.port, { host: "api.warren.test", path: "/health", headers: { "X-Forwarded-Proto": "https" } });
    expect(seen.proto).toBe("http");
  });

  it("leaves other domains' api hosts and sandbox hosts alone", async () => {
    expect(await send(proxy.port, { host: "api.elsewhere.test" })).toMatchObject({ status: 400 });
    const sandbox = await send(proxy.port, { host: `49983-${randomSandboxId()}.warren.test` });
    expect(sandbox.status).toBe(502);
    expect(JSON.parse(sandbox.body)).toMatchObject({ message: "The sandbox was not found" });
  });

  it("answers 502 in the api's error shape when the api is down", async () => {
    const down = await startTestProxy({ PROXY_API_URL: `http://127.0.0.1:${await closedPort()}` });
    try {
      const reply = await send(down.port, { host: "api.any.test", path: "/health" });
      expect(reply.status).toBe(502);
      expect(JSON.parse(reply.body)).toEqual({ code: 502, message: "The API is not reachable through this proxy" });
    } finally {
      await down.close();
    }
  });

  it("takes only an http base URL", () => {
    for (const bad of ["https://127.0.0.1:3000", "http://127.0.0.1:3000/api", "not a url"]) {
      expect(() => loadConfig({ PROXY_API_URL: bad })).toThrow(ConfigError);
    }
    expect(loadConfig({ PROXY_API_URL: "http://[::1]:3000" }).apiUpstream).toEqual({ host: "::1", port: 3000 });
    expect(loadConfig({}).apiUpstream).toBeUndefined();
  });
});
