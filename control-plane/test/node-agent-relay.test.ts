import { connect, createServer, type Server, type Socket } from "node:net";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import { BUILD_TIMEOUT_MS, purgeAgent, startTestAgent, testConfig } from "./node-agent-harness.js";

// A real node agent with the relay on: CONNECT reaches only this node's running sandboxes.
const TOKEN = "relay-test-token-0123456789";
const SETUP = { instance: "tg", cidr: "10.210.24.0/22", extraEnv: { WARREN_RELAY_TOKEN: TOKEN } };
const config = testConfig(SETUP);
let running: RunningNodeAgent;
let sandboxAddr = "";
/** Listens on every local address: a relay that dialled a local target would show up here. */
let canary: Server;
let canaryPort = 0;
const canaryHits: string[] = [];

interface Answer {
  readonly status: number;
  readonly head: string;
  /** The socket, still open after a 200 (the tunnel). */
  readonly socket: Socket;
  readonly rest: Buffer;
}

/** Sends `CONNECT target` to the agent and reads its answer's head. */
/** `token` null: no Warren-Relay-Token header at all. */
function connectVia(target: string, token: string | null = TOKEN): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port: running.port });
    let received = Buffer.alloc(0);
    socket.on("error", reject);
    socket.on("data", function onData(chunk: Buffer) {
      received = Buffer.concat([received, chunk]);
      const end = received.indexOf("\r\n\r\n");
      if (end < 0) return;
      socket.off("data", onData);
      const head = received.subarray(0, end).toString("latin1");
      resolve({ status: Number(head.slice(9, 12)), head, socket, rest: received.subarray(end + 4) });
    });
    const auth = token === null ? "" : `Warren-Relay-Token: ${token}\r\n`;
    socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${auth}\r\n`);
  });
}

/** Reads everything until the peer closes. */
function readAll(socket: Socket, first: Buffer = Buffer.alloc(0)): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks = [first];
    socket.on("data", (chunk: Buffer) => chunks.push(chunk));
    socket.once("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    socket.once("error", reject);
  });
}

beforeAll(async () => {
  canary = createServer((socket) => {
    canaryHits.push(String(socket.localAddress));
    socket.destroy();
  });
  await new Promise<void>((resolve) => canary.listen(0, "0.0.0.0", resolve));
  canaryPort = (canary.address() as { port: number }).port;
  running = await startTestAgent(SETUP);
  const placement = await running.agent.create({ sandboxId: "relayone", teamId: "team-a", templateId: "base" });
  sandboxAddr = placement.sandboxAddr;
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await running?.stop({ killAll: true });
  await purgeAgent(config);
  canary?.close();
}, 120_000);

describe("the node agent's relay (CONNECT to this node's sandboxes)", () => {
  it("with the token, CONNECT to a sandbox's envd port tunnels: GET /health answers through it", async () => {
    const answer = await connectVia(`${sandboxAddr}:49983`);
    expect(answer.head).toMatch(/^HTTP\/1\.1 200 Connection Established/);
    answer.socket.write(`GET /health HTTP/1.1\r\nHost: ${sandboxAddr}:49983\r\nConnection: close\r\n\r\n`);
    const response = await readAll(answer.socket, answer.rest);
    expect(response).toMatch(/^HTTP\/1\.1 204 /);
  });

  it("a missing or wrong token is refused with 403 and nothing is dialled", async () => {
    for (const token of [null, "wrong-token-wrong-token", `${TOKEN}x`, ""]) {
      const answer = await connectVia(`${sandboxAddr}:49983`, token);
      expect(answer.status).toBe(403);
      expect(answer.head).not.toContain(TOKEN);
      answer.socket.destroy();
    }
  });

  it("targets that are not one of this node's running sandboxes get 404 before any dial", async () => {
    const before = running.server.listenerCount("connect");
    expect(before).toBe(1);
    const gateway = sandboxAddr.replace(/\.(\d+)$/, (_m, last: string) => `.${Number(last) - 1}`);
    const targets = [
      `127.0.0.1:${canaryPort}`,
      "127.0.0.1:6379",
      `${gateway}:${canaryPort}`, // the node's own address on the sandbox's veth
      "10.210.27.250:80", // inside the agent's range, no sandbox there
      "10.99.12.2:49983", // some other node's sandbox range
      `0.0.0.0:${canaryPort}`,
    ];
    for (const target of targets) {
      const answer = await connectVia(target);
      expect(answer.status, target).toBe(404);
      answer.socket.destroy();
    }
    for (const target of ["localhost:80", `${sandboxAddr}:0`, `${sandboxAddr}:70000`, `[::1]:${canaryPort}`]) {
      const answer = await connectVia(target);
      expect(answer.status, target).toBe(400);
      answer.socket.destroy();
    }
    expect(canaryHits).toEqual([]);
  });

  it("a sandbox port nothing listens on answers 502 with the dial's errno", async () => {
    const answer = await connectVia(`${sandboxAddr}:9`);
    expect(answer.status).toBe(502);
    expect(answer.head).toMatch(/^Warren-Relay-Error: ECONNREFUSED$/m);
    answer.socket.destroy();
  });

  it("a kill cuts the sandbox's open tunnels, and its address is refused afterwards", async () => {
    const placement = await running.agent.create({ sandboxId: "relaytwo", teamId: "team-a", templateId: "base" });
    const answer = await connectVia(`${placement.sandboxAddr}:49983`);
    expect(answer.status).toBe(200);
    const ended = new Promise<void>((resolve) => answer.socket.once("close", () => resolve()));
    answer.socket.on("error", () => undefined);
    await running.agent.kill("relaytwo");
    await ended;
    const after = await connectVia(`${placement.sandboxAddr}:49983`);
    expect(after.status).toBe(404);
    after.socket.destroy();
  });

  it("a paused sandbox's address is refused; it is served again after resume", async () => {
    await running.agent.pause("relayone", true);
    const paused = await connectVia(`${sandboxAddr}:49983`);
    expect(paused.status).toBe(404);
    paused.socket.destroy();
    await running.agent.resume({ sandboxId: "relayone", memory: true });
    const resumed = await connectVia(`${sandboxAddr}:49983`);
    expect(resumed.status).toBe(200);
    resumed.socket.destroy();
  });

  it("the route in Redis names this agent as nodeAddr, where proxies send their CONNECTs", async () => {
    const redis = new Redis(config.redisUrl);
    try {
      expect(await redis.hget("warren:route:relayone", "nodeAddr")).toBe(`127.0.0.1:${running.port}`);
    } finally {
      redis.disconnect();
    }
  });
});
