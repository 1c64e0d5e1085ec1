import { request } from "node:http";
import { type AddressInfo, connect, createServer, type Server, type Socket } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { relayVia } from "../src/admission.js";
import { loadConfig } from "../src/config.js";
import { openRelayTunnel } from "../src/relay.js";
import {
  closedPort,
  RouteWriter,
  randomSandboxId,
  send,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
} from "./harness.js";

// PROXY_RELAY: upstream connections as CONNECT tunnels through the route's node agent. The stand-in agent here
// speaks the relay's wire protocol (control-plane/src/node-agent/relay.ts; the real one is exercised by
// control-plane/test/node-agent-relay.test.ts and e2e/test/relay.test.ts): token header, 200 then splice, or a
// refusal with an optional Warren-Relay-Error errno.
const TOKEN = "proxy-relay-token-0123456789";

interface FakeAgent {
  readonly server: Server;
  readonly addr: string;
  /** CONNECT targets asked so far, in order. */
  readonly asked: string[];
  /** Tokens seen in Warren-Relay-Token. */
  readonly tokens: string[];
  /** Replaces the answer: a raw response head for a refusal, or undefined to tunnel. */
  refuseWith: string | undefined;
  close(): Promise<void>;
}

async function startFakeAgent(): Promise<FakeAgent> {
  const asked: string[] = [];
  const tokens: string[] = [];
  const sockets = new Set<Socket>();
  const agent: FakeAgent = {
    server: createServer((client) => {
      sockets.add(client);
      client.on("close", () => sockets.delete(client));
      client.on("error", () => undefined);
      let received = "";
      const onData = (chunk: Buffer) => {
        received += chunk.toString("latin1");
        const end = received.indexOf("\r\n\r\n");
        if (end < 0) return;
        client.off("data", onData);
        const head = received.slice(0, end);
        const target = /^CONNECT (\S+) HTTP\/1\.1/.exec(head)?.[1] ?? "";
        asked.push(target);
        tokens.push(/^Warren-Relay-Token: (.*)$/im.exec(head)?.[1] ?? "");
        if (agent.refuseWith !== undefined) {
          client.end(agent.refuseWith);
          return;
        }
        const [host, port] = [
          target.slice(0, target.lastIndexOf(":")),
          Number(target.slice(target.lastIndexOf(":") + 1)),
        ];
        const upstream = connect({ host, port });
        upstream.on("error", () =>
          client.end("HTTP/1.1 502 Bad Gateway\r\nWarren-Relay-Error: ECONNREFUSED\r\nContent-Length: 0\r\n\r\n"),
        );
        upstream.once("connect", () => {
          upstream.removeAllListeners("error");
          upstream.on("error", () => client.destroy());
          client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
          client.pipe(upstream).pipe(client);
        });
      };
      client.on("data", onData);
    }),
    addr: "",
    asked,
    tokens,
    refuseWith: undefined,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        agent.server.close(() => resolve());
      }),
  };
  await new Promise<void>((resolve) => agent.server.listen(0, "127.0.0.1", resolve));
  Object.assign(agent, { addr: `127.0.0.1:${(agent.server.address() as AddressInfo).port}` });
  return agent;
}

const routes = new RouteWriter();
let fake: FakeAgent;
let origin: Upstream;
let proxy: TestProxy | undefined;

beforeAll(async () => {
  fake = await startFakeAgent();
  origin = await startUpstream(
    (req, res) => res.end(`origin saw ${req.method} ${req.url}`),
    (server) =>
      server.on("upgrade", (_req, socket: Socket) => {
        socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n");
        socket.pipe(socket);
      }),
  );
});

afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  fake.refuseWith = undefined;
  fake.asked.length = 0;
  fake.tokens.length = 0;
});

afterAll(async () => {
  await routes.cleanup();
  await fake.close();
  await origin.close();
});

function viaHeaders(sandboxId: string, port: number) {
  return { "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": String(port) };
}

describe("PROXY_RELAY=always", () => {
  it("tunnels HTTP through route.nodeAddr with the token, keeps the tunnel pooled, and never dials directly", async () => {
    proxy = await startTestProxy({ PROXY_RELAY: "always", PROXY_RELAY_TOKEN: TOKEN });
    const sandboxId = randomSandboxId();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", nodeAddr: fake.addr, node: "elsewhere" });
    const before = origin.connections();
    for (let i = 0; i < 3; i++) {
      const reply = await send(proxy.port, { path: `/n${i}`, headers: viaHeaders(sandboxId, origin.port) });
      expect(reply).toMatchObject({ status: 200, body: `origin saw GET /n${i}` });
    }
    // One tunnel carried all three requests (keep-alive through the relay), each via CONNECT to sandboxAddr:port.
    expect(fake.asked).toEqual([`127.0.0.1:${origin.port}`]);
    expect(fake.tokens).toEqual([TOKEN]);
    expect(origin.connections() - before).toBe(1);
    expect(proxy.logs()).not.toContain(TOKEN);
  });

  it("tunnels an upgrade and splices it", async () => {
    proxy = await startTestProxy({ PROXY_RELAY: "always", PROXY_RELAY_TOKEN: TOKEN });
    const sandboxId = randomSandboxId();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", nodeAddr: fake.addr });
    const echoed = await new Promise<string>((resolve, reject) => {
      const req = request({
        host: "127.0.0.1",
        port: proxy?.port,
        path: "/ws",
        headers: { ...viaHeaders(sandboxId, origin.port), Connection: "Upgrade", Upgrade: "echo" },
      });
      req.on("upgrade", (res, socket) => {
        expect(res.statusCode).toBe(101);
        socket.once("data", (chunk: Buffer) => {
          socket.destroy();
          resolve(chunk.toString());
        });
        socket.write("echo me");
      });
      req.on("error", reject);
      req.end();
    });
    expect(echoed).toBe("echo me");
    expect(fake.asked).toEqual([`127.0.0.1:${origin.port}`]);
  });

  it("maps relay refusals and failures to the 502 bodies of a direct connect failure", async () => {
    proxy = await startTestProxy({ PROXY_RELAY: "always", PROXY_RELAY_TOKEN: TOKEN });
    const sandboxId = randomSandboxId();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", nodeAddr: fake.addr });
    const portClosed = { sandboxId, message: "The sandbox is running but port is not open", port: 9, code: 502 };
    const refusals = [
      "HTTP/1.1 502 Bad Gateway\r\nWarren-Relay-Error: ECONNREFUSED\r\nContent-Length: 0\r\n\r\n",
      "HTTP/1.1 504 Gateway Timeout\r\nWarren-Relay-Error: ETIMEDOUT\r\nContent-Length: 0\r\n\r\n",
      "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
      "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
      "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n",
      "garbage\r\n\r\n",
    ];
    for (const refusal of refusals) {
      fake.refuseWith = refusal;
      const reply = await send(proxy.port, { headers: viaHeaders(sandboxId, 9) });
      expect(reply.status, refusal).toBe(502);
      expect(JSON.parse(reply.body), refusal).toEqual(portClosed);
    }
    // A refused port is retried like a direct ECONNREFUSED (the harness allows one retry).
    fake.refuseWith = refusals[0];
    fake.asked.length = 0;
    await send(proxy.port, { headers: viaHeaders(sandboxId, 9) });
    expect(fake.asked).toHaveLength(2);
  });

  it("an unreachable node agent is a 502 port-closed too, for HTTP and upgrades", async () => {
    proxy = await startTestProxy({ PROXY_RELAY: "always", PROXY_RELAY_TOKEN: TOKEN });
    const sandboxId = randomSandboxId();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", nodeAddr: `127.0.0.1:${await closedPort()}` });
    const reply = await send(proxy.port, { headers: viaHeaders(sandboxId, origin.port) });
    expect(reply.status).toBe(502);
    expect(JSON.parse(reply.body)).toMatchObject({ message: "The sandbox is running but port is not open" });
    const upgrade = await send(proxy.port, {
      headers: { ...viaHeaders(sandboxId, origin.port), Connection: "Upgrade", Upgrade: "echo" },
    });
    expect(upgrade.status).toBe(502);
  });
});

describe("PROXY_RELAY=auto", () => {
  it("connects directly to its own node's sandboxes and relays the others'", async () => {
    proxy = await startTestProxy({ PROXY_RELAY: "auto", PROXY_RELAY_TOKEN: TOKEN, PROXY_NODE_ID: "node-here" });
    const local = randomSandboxId();
    const remote = randomSandboxId();
    await routes.write({ sandboxId: local, sandboxAddr: "127.0.0.1", nodeAddr: fake.addr, node: "node-here" });
    await routes.write({ sandboxId: remote, sandboxAddr: "127.0.0.1", nodeAddr: fake.addr, node: "node-there" });
    expect((await send(proxy.port, { headers: viaHeaders(local, origin.port) })).status).toBe(200);
    expect(fake.asked).toEqual([]);
    expect((await send(proxy.port, { headers: viaHeaders(remote, origin.port) })).status).toBe(200);
    expect(fake.asked).toEqual([`127.0.0.1:${origin.port}`]);
  });
});

describe("relay tunnel and configuration", () => {
  it("bytes the sandbox sends right after the 200 reach the reader", async () => {
    const server = createServer((client) => {
      client.once("data", () => client.write("HTTP/1.1 200 Connection Established\r\n\r\nSSH-2.0-banner\r\n"));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const nodeAddr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    const socket = await new Promise<Socket>((resolve, reject) =>
      openRelayTunnel({ token: TOKEN, timeoutMs: 2000 }, { nodeAddr, host: "10.0.0.2", port: 22 }, (error, s) =>
        error || !s ? reject(error) : resolve(s),
      ),
    );
    const first = await new Promise<string>((resolve) =>
      socket.once("data", (chunk: Buffer) => resolve(String(chunk))),
    );
    expect(first).toBe("SSH-2.0-banner\r\n");
    socket.destroy();
    server.close();
  });

  it("a relay that never answers times out as ETIMEDOUT", async () => {
    const server = createServer(() => undefined);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const nodeAddr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    const error = await new Promise<NodeJS.ErrnoException>((resolve) =>
      openRelayTunnel({ token: TOKEN, timeoutMs: 100 }, { nodeAddr, host: "10.0.0.2", port: 80 }, (e) =>
        resolve(e as NodeJS.ErrnoException),
      ),
    );
    expect(error.code).toBe("ETIMEDOUT");
    server.closeAllConnections?.();
    server.close();
  });

  it("PROXY_RELAY defaults to off, needs a token otherwise, and auto compares route.node with PROXY_NODE_ID", () => {
    const off = loadConfig({});
    expect(off.relay).toBe("off");
    expect(off.relayToken).toBeUndefined();
    expect(() => loadConfig({ PROXY_RELAY: "always" })).toThrow(/PROXY_RELAY=always needs PROXY_RELAY_TOKEN/);
    expect(() => loadConfig({ PROXY_RELAY: "sometimes", PROXY_RELAY_TOKEN: TOKEN })).toThrow(/PROXY_RELAY must be/);
    expect(() => loadConfig({ PROXY_RELAY: "auto", PROXY_RELAY_TOKEN: "short" })).toThrow(/at least 16/);
    const auto = loadConfig({ PROXY_RELAY: "auto", PROXY_RELAY_TOKEN: TOKEN, PROXY_NODE_ID: "n1" });
    const route = (node: string) => ({ node }) as Parameters<typeof relayVia>[1];
    expect(relayVia(auto, route("n1"))).toBe(false);
    expect(relayVia(auto, route("n2"))).toBe(true);
    expect(relayVia({ ...auto, relay: "always" }, route("n1"))).toBe(true);
    expect(relayVia(off, route("n2"))).toBe(false);
    expect(loadConfig({}).nodeId).toMatch(/^[a-z0-9-]{1,63}$/);
  });
});
