import { createHash, randomBytes } from "node:crypto";
import { type IncomingMessage, request } from "node:http";
import type { SandboxRoute } from "@warren/proto/redis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ResumeError, type ResumeRequest, type SandboxResumer } from "../src/resume.js";
import {
  nextRouteEvent,
  prewarmsDone,
  RouteWriter,
  randomSandboxId,
  send,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
  waitForPrewarms,
  waitUntil,
} from "./harness.js";

// This file's own route events: prewarm counts below are of its routes alone, whatever other files write.
const PREFIX = `lifecycle-${randomBytes(4).toString("hex")}:`;
let routes: RouteWriter;
/** Two "incarnations" of a sandbox: each answers with its own name. */
let before: Upstream;
let after: Upstream;

beforeAll(async () => {
  routes = new RouteWriter(PREFIX);
  before = await startUpstream((req, res) => {
    if (req.url === "/stream") {
      res.writeHead(200, { "Content-Type": "text/plain" });
      res.write("tick");
      return; // stays open until the proxy cuts it
    }
    res.end("before");
  });
  after = await startUpstream((_req, res) => res.end("after"));
});
afterAll(async () => {
  await before.close();
  await after.close();
  await routes.cleanup();
});

function routeTo(upstream: Upstream, sandboxId: string, extra: Partial<SandboxRoute> = {}) {
  return routes.write({
    sandboxId,
    sandboxAddr: "127.0.0.1",
    ports: { "3000": `127.0.0.1:${upstream.port}`, "49983": `127.0.0.1:${upstream.port}` },
    ...extra,
  });
}

/** Opens a response that streams until cut, resolving with how it ended. */
async function openStream(proxy: TestProxy, sandboxId: string): Promise<{ ended: Promise<{ complete: boolean }> }> {
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    const req = request(
      { host: "127.0.0.1", port: proxy.port, path: "/stream", headers: { Host: `3000-${sandboxId}.warren.test` } },
      resolve,
    );
    req.on("error", reject);
    req.end();
  });
  await new Promise((resolve) => res.once("data", resolve));
  const ended = new Promise<{ complete: boolean }>((resolve) => {
    res.on("error", () => {});
    res.resume();
    res.once("close", () => resolve({ complete: res.complete }));
  });
  return { ended };
}

describe("incarnations (exec/generation)", () => {
  let proxy: TestProxy;
  beforeAll(async () => {
    // A long cache TTL: only the route events can make the proxy notice a change.
    proxy = await startTestProxy({
      WARREN_REDIS_PREFIX: PREFIX,
      PROXY_DOMAINS: "warren.test",
      PROXY_ROUTE_CACHE_TTL_MS: "600000",
      // Incarnations stay apart with connections opened ahead of the first request too.
      PROXY_PREWARM_ENVD: "true",
    });
  });
  afterAll(() => proxy.close());

  it("after a resume publishes a new exec, the next request goes to the new incarnation, never the cached old one", async () => {
    const sandboxId = randomSandboxId();
    const host = `3000-${sandboxId}.warren.test`;
    await routeTo(before, sandboxId, { exec: "exec-a", generation: 1 });
    expect((await send(proxy.port, { host })).body).toBe("before");
    expect((await send(proxy.port, { host })).body).toBe("before"); // now served from the cache

    const seen = nextRouteEvent(proxy, (e) => e.sandboxId === sandboxId && e.exec === "exec-b");
    await routeTo(after, sandboxId, { exec: "exec-b", generation: 2 });
    await seen;
    expect((await send(proxy.port, { host })).body).toBe("after");
  });

  it("a late write of the old incarnation is refused by the contract and changes nothing", async () => {
    const sandboxId = randomSandboxId();
    const host = `3000-${sandboxId}.warren.test`;
    await routeTo(after, sandboxId, { exec: "exec-new", generation: 5 });
    await expect(routeTo(before, sandboxId, { exec: "exec-old", generation: 4 })).rejects.toThrow(/stale/);
    expect((await send(proxy.port, { host })).body).toBe("after");
  });

  it("never reuses a pooled connection of the old incarnation, even at the same address", async () => {
    const sandboxId = randomSandboxId();
    const host = `3000-${sandboxId}.warren.test`;
    // Port 3000 and envd's share the address here, so the connection the proxy opens to envd ahead of the first
    // request (prewarm.ts) is the pool's too: wait for it, so every connection below is counted once.
    let prewarms = await prewarmsDone(proxy);
    const start = after.connections();
    await routeTo(after, sandboxId, { exec: "exec-1", generation: 1 });
    await waitForPrewarms(proxy, ++prewarms);
    await send(proxy.port, { host });
    const pooled = after.connections();
    expect(pooled).toBe(start + 1); // the request took the prewarmed connection
    await send(proxy.port, { host });
    expect(after.connections()).toBe(pooled); // keep-alive within one incarnation

    const seen = nextRouteEvent(proxy, (e) => e.sandboxId === sandboxId && e.exec === "exec-2");
    await routeTo(after, sandboxId, { exec: "exec-2", generation: 2 });
    await seen;
    await waitForPrewarms(proxy, ++prewarms);
    await send(proxy.port, { host });
    expect(after.connections()).toBe(pooled + 1);
  });

  it("kill during a stream resets it and /health answers 502", async () => {
    const sandboxId = randomSandboxId();
    const route = await routeTo(before, sandboxId);
    const { ended } = await openStream(proxy, sandboxId);
    await routes.delete(sandboxId, route.exec);
    expect(await ended).toEqual({ complete: false });
    const health = await send(proxy.port, {
      host: `127.0.0.1:${proxy.port}`,
      path: "/health",
      headers: { "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": "49983" },
    });
    expect(health.status).toBe(502);
    expect(JSON.parse(health.body)).toMatchObject({ sandboxId, message: "The sandbox was not found" });
  });

  it("a new incarnation resets streams of the old one and leaves its own alone", async () => {
    const sandboxId = randomSandboxId();
    await routeTo(before, sandboxId, { exec: "exec-x", generation: 1 });
    const { ended: oldStream } = await openStream(proxy, sandboxId);
    await routeTo(before, sandboxId, { exec: "exec-y", generation: 2 });
    expect(await oldStream).toEqual({ complete: false });
    const { ended: newStream } = await openStream(proxy, sandboxId);
    // An event for the same incarnation (e.g. a port map update) does not cut it.
    const seen = nextRouteEvent(proxy, (e) => e.sandboxId === sandboxId && e.generation === 3);
    await routeTo(before, sandboxId, { exec: "exec-y", generation: 3 });
    await seen;
    expect(proxy.running.proxy.openConnections).toBe(1);
    await routes.delete(sandboxId, "exec-y");
    expect(await newStream).toEqual({ complete: false });
  });

  it("a paused sandbox without auto-resume answers 502 not found", async () => {
    const sandboxId = randomSandboxId();
    await routeTo(before, sandboxId, { state: "paused", autoResume: false });
    const reply = await send(proxy.port, { host: `3000-${sandboxId}.warren.test` });
    expect(reply.status).toBe(502);
    expect(reply.body).toBe(`{"sandboxId":"${sandboxId}","message":"The sandbox was not found","code":502}`);
  });
});

/** A control plane stand-in at the SandboxResumer seam: records calls, then does what the test says. */
class FakeResumer implements SandboxResumer {
  readonly calls: ResumeRequest[] = [];
  constructor(private readonly behave: (request: ResumeRequest) => Promise<void>) {}
  async resume(request: ResumeRequest): Promise<void> {
    this.calls.push(request);
    await this.behave(request);
  }
}

describe("auto-resume", () => {
  const TOKEN = "resume-traffic-token";
  let proxy: TestProxy;
  let behaviour: (request: ResumeRequest) => Promise<void> = async () => {};
  const resumer = new FakeResumer((request) => behaviour(request));
  beforeAll(async () => {
    proxy = await startTestProxy(
      { WARREN_REDIS_PREFIX: PREFIX, PROXY_DOMAINS: "warren.test", PROXY_RESUME_TIMEOUT_MS: "1500" },
      { resumer },
    );
  });
  afterAll(() => proxy.close());

  it("holds concurrent requests to a paused sandbox, resumes it once, then forwards them all to the new incarnation", async () => {
    const sandboxId = randomSandboxId();
    const paused = await routeTo(before, sandboxId, { state: "paused", autoResume: true, exec: "e1", generation: 1 });
    const callsBefore = resumer.calls.length;
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    behaviour = async () => {
      await released; // the resume is still running while all requests arrive
      await routeTo(after, sandboxId, { state: "running", autoResume: true, exec: "e2", generation: 2 });
    };
    const host = `3000-${sandboxId}.warren.test`;
    const replies = Array.from({ length: 8 }, () => send(proxy.port, { host }));
    await waitUntil(() => resumer.calls.length > callsBefore, "the resume call");
    release();
    const bodies = (await Promise.all(replies)).map((r) => `${r.status} ${r.body}`);
    expect(bodies).toEqual(Array(8).fill("200 after"));
    expect(resumer.calls.length - callsBefore).toBe(1);
    expect(resumer.calls.at(-1)).toMatchObject({ sandboxId, exec: paused.exec, port: 3000 });
  });

  it.each([
    [
      "forbidden",
      403,
      "This sandbox can't be resumed with the credentials provided. Check your access token and try again.",
    ],
    ["transitioning", 409, "The sandbox is still transitioning. Try again in a moment."],
    ["limit", 429, "Team sandbox limit reached (20)"],
    ["not-found", 502, "The sandbox was not found"],
  ] as const)("a %s refusal answers %i with E2B's message", async (refusal, status, message) => {
    const sandboxId = randomSandboxId();
    await routeTo(before, sandboxId, { state: "paused", autoResume: true });
    behaviour = async () => {
      throw new ResumeError(refusal, refusal === "limit" ? message : "refused");
    };
    const reply = await send(proxy.port, { host: `3000-${sandboxId}.warren.test` });
    expect(reply.status).toBe(status);
    expect(reply.body).toBe(JSON.stringify({ sandboxId, message, code: status }));
  });

  it("gives up with 409 when the sandbox is not running within the bounded wait", async () => {
    const sandboxId = randomSandboxId();
    await routeTo(before, sandboxId, { state: "paused", autoResume: true });
    behaviour = async () => {}; // accepted, but no new route ever appears
    const reply = await send(proxy.port, { host: `3000-${sandboxId}.warren.test` });
    expect(reply.status).toBe(409);
  });

  it("checks the traffic token before resuming a private sandbox, and passes the tokens it got to the resumer", async () => {
    const sandboxId = randomSandboxId();
    const hash = createHash("sha256").update(TOKEN).digest("hex");
    await routeTo(before, sandboxId, { state: "paused", autoResume: true, public: false, trafficTokenHash: hash });
    const callsBefore = resumer.calls.length;
    const refused = await send(proxy.port, { host: `3000-${sandboxId}.warren.test` });
    expect(refused.status).toBe(403);
    expect(resumer.calls.length).toBe(callsBefore);

    behaviour = async () => {
      await routeTo(after, sandboxId, { generation: 2, public: false, trafficTokenHash: hash });
    };
    const ok = await send(proxy.port, {
      host: `3000-${sandboxId}.warren.test`,
      headers: { "e2b-traffic-access-token": TOKEN, "X-Access-Token": "envd-token" },
    });
    expect(ok.status).toBe(200);
    expect(resumer.calls.at(-1)).toMatchObject({ trafficAccessToken: TOKEN, envdAccessToken: "envd-token" });
    expect(proxy.logs()).not.toContain(TOKEN);
    expect(proxy.logs()).not.toContain("envd-token");
  });

  it("waits without calling the resumer when the sandbox is already resuming", async () => {
    const sandboxId = randomSandboxId();
    await routeTo(before, sandboxId, { state: "resuming", autoResume: true, generation: 1 });
    const callsBefore = resumer.calls.length;
    const reply = send(proxy.port, { host: `3000-${sandboxId}.warren.test` });
    await waitUntil(() => proxy.running.proxy.pendingResumes === 1, "the request to be held");
    await routeTo(after, sandboxId, { state: "running", autoResume: true, generation: 2 });
    expect((await reply).body).toBe("after");
    expect(resumer.calls.length).toBe(callsBefore);
  });
});

describe("graceful shutdown", () => {
  it("stops accepting new connections but lets an in-flight stream finish", async () => {
    const proxy = await startTestProxy({ WARREN_REDIS_PREFIX: PREFIX, PROXY_DOMAINS: "warren.test" });
    const finish = { release: () => {} };
    const upstream = await startUpstream((_req, res) => {
      res.writeHead(200, { "Content-Type": "text/plain" });
      res.write("part one;");
      finish.release = () => res.end("part two");
    });
    const sandboxId = randomSandboxId();
    await routeTo(upstream, sandboxId);
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = request(
        { host: "127.0.0.1", port: proxy.port, headers: { Host: `3000-${sandboxId}.warren.test` } },
        resolve,
      );
      req.on("error", reject);
      req.end();
    });
    let body = "";
    res.on("data", (chunk) => {
      body += chunk;
    });
    const ended = new Promise((resolve) => res.once("end", resolve));
    await waitUntil(() => body.length > 0, "the first part");

    const closing = proxy.close();
    await expect(send(proxy.port, { host: `3000-${sandboxId}.warren.test` })).rejects.toThrow(/ECONNREFUSED/);
    finish.release();
    await ended;
    await closing;
    expect(body).toBe("part one;part two");
    expect(res.complete).toBe(true);
    await upstream.close();
  });
});
