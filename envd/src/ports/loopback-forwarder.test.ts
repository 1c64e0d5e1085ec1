import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { silentLogger } from "../log.js";
import { LoopbackForwarder, loopbackOnlyPorts } from "./loopback-forwarder.js";
import { parseProcNetTcp, readTcpListeners } from "./tcp-listeners.js";

// Real sockets on this host's loopback: services on 127.0.0.1, forwards on 127.0.0.2 (standing in for the
// sandbox's own address). The forwarder reads the real /proc/net/tcp, filtered to the test's ports, so nothing of
// the host's own loopback services is ever forwarded.
const FORWARD_ADDRESS = "127.0.0.2";
const servers: Server[] = [];
const forwarders: LoopbackForwarder[] = [];

afterEach(async () => {
  await Promise.all(forwarders.splice(0).map((f) => f.close()));
  await Promise.all(servers.splice(0).map((s) => new Promise((resolve) => s.close(resolve))));
});

async function serve(host: string, body: string): Promise<{ server: Server; port: number }> {
  const server = createServer((_req, res) => res.end(body));
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return { server, port: (server.address() as AddressInfo).port };
}

function forwarderFor(ports: () => number[]): LoopbackForwarder {
  const forwarder = new LoopbackForwarder({
    listeners: async () => (await readTcpListeners()).filter((l) => ports().includes(l.port)),
    bindAddresses: () => [FORWARD_ADDRESS],
    log: silentLogger,
  });
  forwarders.push(forwarder);
  return forwarder;
}

describe("/proc/net/tcp parsing", () => {
  it("reads listening sockets of both families and skips other states", () => {
    const v4 = [
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
      "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0",
      "   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0",
      "   2: 0200A8C0:C350 0100A8C0:01BB 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 20 4 30 10 -1",
    ].join("\n");
    expect(parseProcNetTcp(v4, 4)).toEqual([
      { family: 4, address: "127.0.0.1", port: 8080 },
      { family: 4, address: "0.0.0.0", port: 22 },
    ]);
    const v6 = [
      "  sl  local_address                         remote_address                        st",
      "   0: 00000000000000000000000001000000:1389 00000000000000000000000000000000:0000 0A 0",
      "   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0",
      "   2: 0000000000000000FFFF00000100007F:0BB8 00000000000000000000000000000000:0000 0A 0",
    ].join("\n");
    expect(parseProcNetTcp(v6, 6)).toEqual([
      { family: 6, address: "::1", port: 5001 },
      { family: 6, address: "::", port: 80 },
      { family: 6, address: "0:0:0:0:0:ffff:7f00:1", port: 3000 },
    ]);
  });

  it("forwards only ports listened on at loopback and nowhere reachable", () => {
    const ports = loopbackOnlyPorts(
      [
        { family: 4, address: "127.0.0.1", port: 5173 }, // a dev server on localhost
        { family: 6, address: "::1", port: 5173 },
        { family: 6, address: "::1", port: 8888 },
        { family: 6, address: "0:0:0:0:0:ffff:7f00:1", port: 3000 },
        { family: 4, address: "127.0.0.1", port: 8000 },
        { family: 4, address: "0.0.0.0", port: 8000 }, // also on every address: reachable already
        { family: 4, address: "127.0.0.1", port: 9000 },
        { family: 4, address: "10.0.0.2", port: 9000 }, // someone else's listener at the sandbox address
        { family: 4, address: "127.0.0.1", port: 7000 },
        { family: 4, address: "10.0.0.2", port: 7000 }, // our own forward
      ],
      new Map([[7000, { addresses: ["10.0.0.2"] }]]),
    );
    expect(Object.fromEntries(ports)).toEqual({
      5173: "127.0.0.1",
      8888: "::1",
      3000: "127.0.0.1",
      7000: "127.0.0.1",
    });
  });
});

describe("loopback forwarder", () => {
  it("makes a loopback-only service reachable at the sandbox address, keeps it while it listens, ends with it", async () => {
    const { server, port } = await serve("127.0.0.1", "from the loopback service");
    const forwarder = forwarderFor(() => [port]);
    await forwarder.refresh();
    expect(forwarder.active()).toEqual([{ port, target: "127.0.0.1" }]);
    expect(await (await fetch(`http://${FORWARD_ADDRESS}:${port}/`)).text()).toBe("from the loopback service");
    // Its own listener at the forward address shows in /proc/net/tcp now: that does not end the forward.
    await forwarder.refresh();
    expect(forwarder.active()).toEqual([{ port, target: "127.0.0.1" }]);
    await new Promise((resolve) => server.close(resolve));
    await forwarder.refresh();
    expect(forwarder.active()).toEqual([]);
    await expect(fetch(`http://${FORWARD_ADDRESS}:${port}/`)).rejects.toThrow();
  });

  it("moves its forwards when the sandbox's address changes (a fork restored from a memory snapshot)", async () => {
    const { port } = await serve("127.0.0.1", "moved");
    let address = FORWARD_ADDRESS;
    const forwarder = new LoopbackForwarder({
      listeners: async () => (await readTcpListeners()).filter((l) => l.port === port),
      bindAddresses: () => [address],
      log: silentLogger,
    });
    forwarders.push(forwarder);
    await forwarder.refresh();
    address = "127.0.0.3";
    await forwarder.refresh();
    expect(forwarder.active()).toEqual([{ port, target: "127.0.0.1" }]);
    expect(await (await fetch(`http://127.0.0.3:${port}/`)).text()).toBe("moved");
    await expect(fetch(`http://${FORWARD_ADDRESS}:${port}/`)).rejects.toThrow();
  });

  it("leaves a service on 0.0.0.0 alone and forwards nothing when there is no loopback-only listener", async () => {
    const { port } = await serve("0.0.0.0", "everywhere");
    const forwarder = forwarderFor(() => [port]);
    await forwarder.refresh();
    expect(forwarder.active()).toEqual([]);
  });

  it("streams both ways and passes a half-close through (the service answers after the client's end)", async () => {
    const { createServer: createTcpServer, createConnection } = await import("node:net");
    const echo = createTcpServer({ allowHalfOpen: true }, (socket) => {
      const chunks: Buffer[] = [];
      socket.on("data", (chunk: Buffer) => chunks.push(chunk));
      socket.on("end", () => socket.end(`got ${Buffer.concat(chunks).length} bytes`));
    });
    await new Promise<void>((resolve) => echo.listen(0, "127.0.0.1", resolve));
    const port = (echo.address() as AddressInfo).port;
    try {
      const forwarder = forwarderFor(() => [port]);
      await forwarder.refresh();
      const reply = await new Promise<string>((resolve, reject) => {
        const client = createConnection({ host: FORWARD_ADDRESS, port, allowHalfOpen: true });
        let text = "";
        client.on("data", (chunk: Buffer) => {
          text += chunk.toString();
        });
        client.on("end", () => resolve(text));
        client.on("error", reject);
        client.end(Buffer.alloc(3 << 20, 1));
      });
      expect(reply).toBe(`got ${3 << 20} bytes`);
    } finally {
      await new Promise((resolve) => echo.close(resolve));
    }
  });
});
