import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import { type AddressInfo, connect, createServer, type Server, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { createLogger } from "./log.js";
import { parseTarget, type RelaySandbox, SandboxRelay } from "./relay.js";

const TOKEN = "unit-relay-token-0123456789";
const cleanup: (() => void)[] = [];

afterEach(() => {
  for (const fn of cleanup.splice(0)) fn();
});

/** The relay on a real HTTP server, with `sandboxes` as the node's sandboxes (addresses are loopback here). */
async function startRelay(token: string | undefined, sandboxes: RelaySandbox[]) {
  const lines: string[] = [];
  const log = createLogger("node-agent", { level: "debug", write: (line) => lines.push(line) });
  const relay = new SandboxRelay({
    token,
    log,
    sweepMs: 20,
    sandboxes: { list: () => sandboxes, get: (id) => sandboxes.find((s) => s.sandboxId === id) },
  });
  const server: HttpServer = createHttpServer();
  relay.attach(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanup.push(() => {
    relay.close();
    server.close();
  });
  return { relay, port: (server.address() as AddressInfo).port, lines };
}

/** A TCP server that greets first, then echoes; it records whether it saw end-of-input. */
async function startGreeter(): Promise<{ server: Server; port: number; sawEnd: () => boolean }> {
  let sawEnd = false;
  const server = createServer({ allowHalfOpen: true }, (socket) => {
    socket.write("hello\n");
    socket.on("data", (chunk) => socket.write(chunk));
    socket.on("end", () => {
      sawEnd = true;
      socket.end("bye\n");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanup.push(() => server.close());
  return { server, port: (server.address() as AddressInfo).port, sawEnd: () => sawEnd };
}

function ask(port: number, target: string, token?: string): Promise<{ socket: Socket; text: () => string }> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port, allowHalfOpen: true });
    let text = "";
    socket.setEncoding("latin1");
    socket.on("data", (chunk: string) => {
      text += chunk;
    });
    socket.on("error", reject);
    socket.once("connect", () => {
      const auth = token === undefined ? "" : `Warren-Relay-Token: ${token}\r\n`;
      socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${auth}\r\n`);
      resolve({ socket, text: () => text });
    });
  });
}

async function until(condition: () => boolean): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 5));
  }
}

const box = (over: Partial<RelaySandbox> = {}): RelaySandbox => ({
  sandboxId: "sbx1",
  exec: "e1",
  sandboxAddr: "127.0.0.1",
  paused: false,
  ...over,
});

describe("SandboxRelay", () => {
  it("without WARREN_RELAY_TOKEN every CONNECT is answered 405, even with a token", async () => {
    const { port } = await startRelay(undefined, [box()]);
    const { text } = await ask(port, "127.0.0.1:1", TOKEN);
    await until(() => text().includes("\r\n\r\n"));
    expect(text()).toMatch(/^HTTP\/1\.1 405 Method Not Allowed\r\n/);
    expect(text()).toContain("WARREN_RELAY_TOKEN is not set");
  });

  it("splices both ways: server-first bytes, echo, half-close passed on; the close is logged without the token", async () => {
    const greeter = await startGreeter();
    const { port, relay, lines } = await startRelay(TOKEN, [box()]);
    const { socket, text } = await ask(port, `127.0.0.1:${greeter.port}`, TOKEN);
    await until(() => text().includes("hello\n"));
    expect(text()).toBe("HTTP/1.1 200 Connection Established\r\n\r\nhello\n");
    socket.write("ping\n");
    await until(() => text().endsWith("ping\n"));
    socket.end();
    await until(() => greeter.sawEnd() && text().endsWith("bye\n"));
    await until(() => relay.stats().open === 0);
    expect(relay.stats()).toMatchObject({ opened: 1, open: 0 });
    const closed = lines.map((l) => JSON.parse(l)).find((l) => l.msg === "relay tunnel closed");
    expect(closed).toMatchObject({ sandboxId: "sbx1", exec: "e1", port: greeter.port, bytesToSandbox: 5 });
    expect(lines.join("")).not.toContain(TOKEN);
  });

  it("the sweep cuts a tunnel once its sandbox is paused or replaced by a new incarnation", async () => {
    const greeter = await startGreeter();
    const sandboxes = [box()];
    const { port } = await startRelay(TOKEN, sandboxes);
    for (const next of [box({ exec: "e2" }), box({ exec: "e2", paused: true })]) {
      const tunnel = await ask(port, `127.0.0.1:${greeter.port}`, TOKEN);
      await until(() => tunnel.text().includes("hello\n"));
      const ended = new Promise<void>((resolve) => tunnel.socket.once("end", () => resolve()));
      sandboxes[0] = next;
      await ended;
    }
  });

  it("parses only IPv4 literal targets with a port in 1–65535", () => {
    expect(parseTarget("10.201.0.2:49983")).toEqual({ host: "10.201.0.2", port: 49983 });
    for (const bad of ["10.201.0.2", "10.201.0.256:80", "10.201.0.2:0", "10.201.0.2:65536", "host:80", "[::1]:80"]) {
      expect(parseTarget(bad), bad).toBeUndefined();
    }
  });
});
