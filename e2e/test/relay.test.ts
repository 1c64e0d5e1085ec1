import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// The cross-node data path: the proxy runs with PROXY_RELAY=always, so every connection to a sandbox is a
// CONNECT tunnel through the node agent's relay (route.nodeAddr), as for a proxy on another node. Proof that the
// relay carried the traffic: every TCP connection to the sandbox's address belongs to the node agent's process,
// none to the proxy's, and the agent logs each tunnel it closed.
const dataDir = mkdtempSync(join(tmpdir(), "warren-relay-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "r",
  nodeCidr: () => "10.220.0.0/22",
  relay: true,
});
let env: Awaited<ReturnType<LocalCluster["start"]>>;

// A tiny HTTP server on port 8000 that also accepts an upgrade and then echoes the raw bytes.
const SERVER =
  `node -e "const s = require('http').createServer((q, r) => r.end('hello via ' + q.headers.host));` +
  ` s.on('upgrade', (q, c) => { c.write('HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\n'); c.pipe(c); });` +
  ` s.listen(8000)"`;

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await cluster.stop();
  if (!process.env.WARREN_E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

function pidOf(name: string): number {
  const child = cluster.processes.find((p) => p.name === name);
  if (!child?.child.pid) throw new Error(`no process ${name}`);
  return child.child.pid;
}

/** Pids owning established TCP connections to `addr` (ss reads the kernel's socket table). */
function ownersOfConnectionsTo(addr: string): number[] {
  const out = execFileSync("ss", ["-tnpH", "state", "established", "dst", addr], { encoding: "utf8" });
  return [...out.matchAll(/pid=(\d+)/g)].map((m) => Number(m[1]));
}

async function sandboxAddrOf(sandboxId: string): Promise<string> {
  const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
  try {
    return (await redis.hget(`warren:route:${sandboxId}`, "sandboxAddr")) ?? "";
  } finally {
    redis.disconnect();
  }
}

function viaProxy(sandboxId: string, port: number): Promise<Response> {
  return fetch(`${env.E2B_SANDBOX_URL}/`, {
    headers: { "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": String(port) },
  });
}

/** An upgrade through the proxy to port 8000, then bytes echoed back through the spliced tunnel (left open). */
function upgradeEcho(sandboxId: string, text: string): Promise<{ head: string; echoed: string; socket: Socket }> {
  const url = new URL(env.E2B_SANDBOX_URL);
  return new Promise((resolve, reject) => {
    const socket = connect({ host: url.hostname, port: Number(url.port) });
    let received = "";
    let head = "";
    socket.setEncoding("latin1");
    socket.on("error", reject);
    socket.on("data", (chunk: string) => {
      received += chunk;
      if (!head) {
        const end = received.indexOf("\r\n\r\n");
        if (end < 0) return;
        head = received.slice(0, end);
        received = received.slice(end + 4);
        socket.write(text);
      }
      if (received.length >= text.length) resolve({ head, echoed: received, socket });
    });
    socket.write(
      `GET /echo HTTP/1.1\r\nHost: ${url.host}\r\nE2b-Sandbox-Id: ${sandboxId}\r\nE2b-Sandbox-Port: 8000\r\n` +
        "Connection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    );
  });
}

describe("the proxy reaches sandboxes only through the node agent's relay (PROXY_RELAY=always)", () => {
  it("the e2b SDK runs commands, writes and reads files, and reaches port 8000 (HTTP and upgrade) via the relay", async () => {
    const sandbox = await Sandbox.create();
    const addr = await sandboxAddrOf(sandbox.sandboxId);
    expect(addr).toMatch(/^10\.220\./);
    try {
      const who = await sandbox.commands.run("id -un && echo $E2B_SANDBOX");
      expect(who.stdout).toBe("user\ntrue\n");
      await sandbox.files.write("relay/hello.txt", "through the node agent");
      expect(await sandbox.files.read("/home/user/relay/hello.txt")).toBe("through the node agent");
      expect((await sandbox.commands.run("cat relay/hello.txt")).stdout).toBe("through the node agent");
      // A streamed command: output arrives while it runs, over the same tunnelled envd connection pool.
      const lines: string[] = [];
      await sandbox.commands.run("for i in 1 2 3; do echo line$i; sleep 0.1; done", {
        onStdout: (line) => {
          lines.push(line);
        },
      });
      expect(lines.join("")).toBe("line1\nline2\nline3\n");

      await sandbox.commands.run(SERVER, { background: true });
      let answer: Response | undefined;
      const deadline = Date.now() + 15_000;
      while (Date.now() < deadline) {
        answer = await viaProxy(sandbox.sandboxId, 8000);
        if (answer.status === 200) break;
        await answer.text();
        await new Promise((r) => setTimeout(r, 200));
      }
      expect(answer?.status).toBe(200);
      expect(await answer?.text()).toMatch(/^hello via /);
      const upgraded = await upgradeEcho(sandbox.sandboxId, "ping through the relay");
      expect(upgraded.head).toMatch(/^HTTP\/1\.1 101 /);
      expect(upgraded.echoed).toBe("ping through the relay");

      // While the upgraded stream is open and the proxy's keep-alive pool holds connections to this sandbox
      // (envd, port 8000), every TCP connection to the sandbox's address is the node agent's, none the proxy's.
      const owners = ownersOfConnectionsTo(addr);
      expect(owners.length).toBeGreaterThanOrEqual(3);
      const agentPid = cluster.nodeAgentChildren[0]?.child.pid;
      expect(new Set(owners)).toEqual(new Set([agentPid]));
      expect(owners).not.toContain(pidOf("proxy"));
      upgraded.socket.destroy();
    } finally {
      await sandbox.kill();
    }
    // The kill cut the tunnels; the agent logged each one, with the bytes it carried, for envd and port 8000.
    const tunnels = await eventually(() => {
      const closed = relayLog().filter((line) => line.sandboxId === sandbox.sandboxId);
      return closed.some((l) => l.port === 8000) && closed.some((l) => l.port === 49983) ? closed : undefined;
    });
    for (const tunnel of tunnels) expect(tunnel.bytesFromSandbox).toBeGreaterThan(0);
  });

  it("the relay token is in no process's log", async () => {
    const token = readFileSync(`/proc/${pidOf("proxy")}/environ`, "utf8")
      .split("\0")
      .find((entry) => entry.startsWith("PROXY_RELAY_TOKEN="))
      ?.slice("PROXY_RELAY_TOKEN=".length);
    expect(token).toMatch(/^[0-9a-f]{48}$/);
    for (const child of cluster.processes) {
      expect(readFileSync(child.logFile, "utf8"), child.name).not.toContain(token);
    }
  });

  it("a port nothing listens on answers the port-closed 502 through the relay", async () => {
    const sandbox = await Sandbox.create();
    try {
      const res = await viaProxy(sandbox.sandboxId, 8001);
      expect(res.status).toBe(502);
      expect(await res.json()).toEqual({
        sandboxId: sandbox.sandboxId,
        message: "The sandbox is running but port is not open",
        port: 8001,
        code: 502,
      });
    } finally {
      await sandbox.kill();
    }
  });
});

interface TunnelLine {
  readonly sandboxId: string;
  readonly port: number;
  readonly bytesFromSandbox: number;
}

function relayLog(): TunnelLine[] {
  const file = cluster.nodeAgentChildren[0]?.logFile ?? "";
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((line) => line.includes('"relay tunnel closed"'))
    .map((line) => JSON.parse(line) as TunnelLine);
}

async function eventually<T>(probe: () => T | undefined, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 200));
  }
}
