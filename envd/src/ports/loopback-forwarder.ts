import { createConnection, createServer, type Server, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import type { Logger } from "../log.js";
import { isLoopback, isWildcard, readTcpListeners, type TcpListener } from "./tcp-listeners.js";

/**
 * E2B's envd forwards every TCP port a sandbox process listens on at loopback only (a dev server's default:
 * Vite, `next dev -H localhost`, `python -m http.server --bind 127.0.0.1`) to the sandbox's own address, so the
 * port is reachable through the proxy like one bound to 0.0.0.0 (`sandbox.getHost(port)`). This does the same,
 * in process: it looks at the namespace's listening sockets every second, and for each port listened on at a
 * loopback address only, it listens on that port at the sandbox's addresses and pipes each connection to the
 * loopback listener. A port someone also listens on at a wildcard or a sandbox address is left alone (already
 * reachable), and the forward ends when the loopback listener goes away. The service sees connections from
 * 127.0.0.1.
 */
export interface LoopbackForwarderOptions {
  /** The namespace's listening sockets (tests pass their own). */
  readonly listeners?: () => Promise<TcpListener[]>;
  /** Where forwards listen: the sandbox's own (non-loopback) IPv4 addresses unless given. */
  readonly bindAddresses?: () => string[];
  readonly intervalMs?: number;
  readonly log: Logger;
}

interface Forward {
  readonly port: number;
  /** The loopback address connections go to. */
  readonly target: string;
  /** The sandbox addresses it listens on (a sandbox forked from a memory snapshot has new ones). */
  readonly addresses: readonly string[];
  readonly servers: Server[];
  readonly sockets: Set<Socket>;
}

export class LoopbackForwarder {
  private readonly forwards = new Map<number, Forward>();
  /** Ports whose forward could not listen, not tried again while their loopback listener stays (no log flood). */
  private readonly failed = new Map<number, string>();
  private timer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> | undefined;
  private closed = false;

  constructor(private readonly options: LoopbackForwarderOptions) {}

  start(): void {
    this.timer ??= setInterval(() => void this.refresh(), this.options.intervalMs ?? 1000);
    this.timer.unref();
    void this.refresh();
  }

  /** Ports forwarded now, with the loopback address each goes to. */
  active(): Array<{ port: number; target: string }> {
    return [...this.forwards.values()].map(({ port, target }) => ({ port, target }));
  }

  /** One look at the listening sockets: starts missing forwards and ends stale ones (tests call it directly). */
  refresh(): Promise<void> {
    this.refreshing ??= this.sync().finally(() => {
      this.refreshing = undefined;
    });
    return this.refreshing;
  }

  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    await this.refreshing?.catch(() => undefined);
    await Promise.all([...this.forwards.values()].map((forward) => this.end(forward)));
  }

  private async sync(): Promise<void> {
    if (this.closed) return;
    let listeners: TcpListener[];
    try {
      listeners = await (this.options.listeners ?? readTcpListeners)();
    } catch (error) {
      this.options.log.warn("reading the listening sockets failed", { error: (error as Error).message });
      return;
    }
    const wanted = loopbackOnlyPorts(listeners, this.forwards);
    // The sandbox's addresses (a netlink dump) only when a forward is wanted or runs: an idle sandbox has neither.
    if (wanted.size === 0 && this.forwards.size === 0) {
      this.failed.clear();
      return;
    }
    const bindAddresses = (this.options.bindAddresses ?? sandboxAddresses)();
    const addressesKey = bindAddresses.join(",");
    for (const [port, forward] of this.forwards) {
      if (wanted.get(port) !== forward.target || forward.addresses.join(",") !== addressesKey) await this.end(forward);
    }
    for (const [port, target] of this.failed) if (wanted.get(port) !== target) this.failed.delete(port);
    for (const [port, target] of wanted) {
      if (this.closed || this.forwards.has(port) || this.failed.has(port) || bindAddresses.length === 0) continue;
      const forward = await this.begin(port, target, bindAddresses);
      if (forward) this.forwards.set(port, forward);
      else this.failed.set(port, target);
    }
  }

  private async begin(port: number, target: string, bindAddresses: readonly string[]): Promise<Forward | undefined> {
    const forward: Forward = { port, target, addresses: [...bindAddresses], servers: [], sockets: new Set() };
    for (const address of bindAddresses) {
      const server = createServer({ allowHalfOpen: true }, (client) => this.pipe(forward, client));
      try {
        await new Promise<void>((resolve, reject) => {
          server.once("error", reject);
          server.listen({ host: address, port, exclusive: true }, () => resolve());
        });
        forward.servers.push(server);
      } catch (error) {
        // Someone took the port at that address in between: the next look sees their listener.
        this.options.log.warn("forwarding a loopback port failed", {
          port,
          address,
          error: (error as Error).message,
        });
      }
    }
    if (forward.servers.length === 0) return undefined;
    this.options.log.info("forwarding a port listened on at loopback only", { port, target });
    return forward;
  }

  private pipe(forward: Forward, client: Socket): void {
    const upstream = createConnection({ host: forward.target, port: forward.port, allowHalfOpen: true });
    for (const socket of [client, upstream]) {
      forward.sockets.add(socket);
      socket.setNoDelay(true);
      socket.once("close", () => forward.sockets.delete(socket));
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.once("error", () => upstream.destroy());
    upstream.once("error", () => client.destroy());
    client.once("close", () => upstream.destroy());
    upstream.once("close", () => client.destroy());
  }

  private async end(forward: Forward): Promise<void> {
    this.forwards.delete(forward.port);
    for (const socket of forward.sockets) socket.destroy();
    await Promise.all(forward.servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
    this.options.log.info("port forward ended", { port: forward.port });
  }
}

/**
 * Port → loopback address for every port listened on at loopback and nowhere else a client outside could reach
 * it (no wildcard listener, none at another address than our own forwards'). 127.0.0.1 is preferred over
 * another 127.x, and IPv4 over ::1.
 */
export function loopbackOnlyPorts(
  listeners: readonly TcpListener[],
  ours: ReadonlyMap<number, { readonly addresses: readonly string[] }>,
): Map<number, string> {
  const reachable = new Set<number>();
  const loopback = new Map<number, string>();
  for (const { address, port } of listeners) {
    if (ours.get(port)?.addresses.includes(address)) continue; // our own forward (at old addresses after a fork)
    if (isWildcard(address)) reachable.add(port);
    else if (isLoopback(address)) {
      const current = loopback.get(port);
      if (current === undefined || rank(address) < rank(current)) loopback.set(port, targetOf(address));
    } else reachable.add(port);
  }
  for (const port of reachable) loopback.delete(port);
  return loopback;
}

function rank(address: string): number {
  if (address === "127.0.0.1") return 0;
  if (address.startsWith("127.")) return 1;
  return 2;
}

/** A mapped IPv4 loopback listener (on an IPv6 socket) is reached at its IPv4 address. */
function targetOf(address: string): string {
  const mapped = /^0:0:0:0:0:ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(address);
  if (!mapped) return address;
  const high = Number.parseInt(mapped[1]!, 16);
  const low = Number.parseInt(mapped[2]!, 16);
  return [high >> 8, high & 0xff, low >> 8, low & 0xff].join(".");
}

/** The sandbox's own IPv4 addresses: every interface's but loopback's. */
export function sandboxAddresses(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .filter((entry) => entry !== undefined && entry.family === "IPv4" && !entry.internal)
    .map((entry) => entry!.address);
}
