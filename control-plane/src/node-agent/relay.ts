import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, Server } from "node:http";
import { connect, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { RELAY_ERROR_HEADER, RELAY_TOKEN_HEADER } from "@warren/proto/ports";
import type { Logger } from "./log.js";

/**
 * The cross-node data path: a proxy on another node cannot reach a sandbox's address (a /30 on a veth of this
 * node), so it asks this node agent for a tunnel with `CONNECT <sandboxAddr>:<port> HTTP/1.1` and a shared secret
 * in `Warren-Relay-Token`. Only the address of a sandbox that is on this node and running is ever dialled: not
 * loopback, not the node's own addresses, not a warm-pool or paused sandbox, not another node's. Every refusal is
 * an HTTP answer written before anything is dialled; a dial failure names its errno in `Warren-Relay-Error`, so
 * the proxy maps it exactly as it maps a direct connect failure.
 */

// node:http hands request headers over with lower-cased names.
const RELAY_TOKEN_HEADER_KEY = RELAY_TOKEN_HEADER.toLowerCase();

/** What the relay needs to know of the node's sandboxes (the NodeAgent is one). */
export interface RelaySandboxes {
  list(): readonly RelaySandbox[];
  get(sandboxId: string): RelaySandbox | undefined;
}

export interface RelaySandbox {
  readonly sandboxId: string;
  readonly exec: string;
  readonly sandboxAddr: string;
  readonly paused: boolean;
}

export interface RelayOptions {
  /** WARREN_RELAY_TOKEN; undefined: the relay is off and every CONNECT is answered 405. */
  readonly token: string | undefined;
  readonly sandboxes: RelaySandboxes;
  readonly log: Logger;
  /** One dial of a sandbox port (default 10 s). */
  readonly dialTimeoutMs?: number;
  /** How often open tunnels are checked against the node's sandboxes (default 1 s). */
  readonly sweepMs?: number;
}

export interface RelayStats {
  /** Tunnels established since start. */
  readonly opened: number;
  /** CONNECTs answered with an error (auth, target, dial). */
  readonly refused: number;
  /** Tunnels open now. */
  readonly open: number;
}

interface Tunnel {
  readonly sandboxId: string;
  readonly exec: string;
  readonly addr: string;
  readonly client: Duplex;
  readonly upstream: Socket;
}

// Sandbox addresses are IPv4 literals (one /30 per sandbox); anything else is no target.
const TARGET = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3}):(\d{1,5})$/;

/** Answers CONNECT on the node agent's HTTP server; `close()` cuts every tunnel (the server waits for none). */
export class SandboxRelay {
  private readonly tunnels = new Set<Tunnel>();
  private readonly tokenDigest: Buffer | undefined;
  private readonly sweeper: NodeJS.Timeout;
  private opened = 0;
  private refused = 0;

  constructor(private readonly options: RelayOptions) {
    this.tokenDigest = options.token === undefined ? undefined : digest(options.token);
    this.sweeper = setInterval(() => this.sweep(), options.sweepMs ?? 1000);
    this.sweeper.unref();
  }

  /** Serves CONNECT on `server` (Node hands the raw socket to the `connect` event). */
  attach(server: Server): this {
    server.on("connect", (req: IncomingMessage, socket: Duplex, head: Buffer) => this.handle(req, socket, head));
    return this;
  }

  stats(): RelayStats {
    return { opened: this.opened, refused: this.refused, open: this.tunnels.size };
  }

  handle(req: IncomingMessage, client: Duplex, head: Buffer): void {
    client.on("error", () => client.destroy());
    const verdict = this.admit(req);
    if ("status" in verdict) this.refuse(client, verdict.status, verdict.message);
    else this.dial(client, head, verdict.sandbox, verdict.port);
  }

  /** Token, then target: a running sandbox of this node, or the refusal to answer. Nothing is dialled here. */
  private admit(
    req: IncomingMessage,
  ): { readonly sandbox: RelaySandbox; readonly port: number } | { readonly status: number; readonly message: string } {
    if (this.tokenDigest === undefined) {
      return { status: 405, message: "the relay is off on this node agent (WARREN_RELAY_TOKEN is not set)" };
    }
    const given = req.headers[RELAY_TOKEN_HEADER_KEY];
    if (typeof given !== "string" || !timingSafeEqual(digest(given), this.tokenDigest)) {
      return { status: 403, message: `missing or wrong ${RELAY_TOKEN_HEADER_KEY}` };
    }
    const target = parseTarget(req.url ?? "");
    if (!target) return { status: 400, message: "the CONNECT target must be <IPv4 address>:<port 1-65535>" };
    const sandbox = this.options.sandboxes.list().find((s) => !s.paused && s.sandboxAddr === target.host);
    if (!sandbox) return { status: 404, message: `no running sandbox of this node has address ${target.host}` };
    return { sandbox, port: target.port };
  }

  /** Cuts every tunnel and stops the sweeper. */
  close(): void {
    clearInterval(this.sweeper);
    for (const tunnel of this.tunnels) {
      tunnel.client.destroy();
      tunnel.upstream.destroy();
    }
  }

  private dial(client: Duplex, head: Buffer, sandbox: RelaySandbox, port: number): void {
    const upstream = connect({ host: sandbox.sandboxAddr, port, noDelay: true });
    const timer = setTimeout(
      () => upstream.destroy(Object.assign(new Error("dial timeout"), { code: "ETIMEDOUT" })),
      this.options.dialTimeoutMs ?? 10_000,
    );
    const abandon = () => upstream.destroy();
    // The proxy gave up (its own connect timeout) while the dial was in flight.
    client.once("close", abandon);
    upstream.once("error", (error: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      client.off("close", abandon);
      const code = error.code ?? "EUNKNOWN";
      this.refuse(client, code === "ETIMEDOUT" ? 504 : 502, `dialling port ${port} failed: ${code}`, code);
    });
    upstream.once("connect", () => {
      clearTimeout(timer);
      client.off("close", abandon);
      upstream.removeAllListeners("error");
      if (client.destroyed) {
        upstream.destroy();
        return;
      }
      client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length > 0) upstream.write(head);
      this.splice(
        { sandboxId: sandbox.sandboxId, exec: sandbox.exec, addr: sandbox.sandboxAddr, client, upstream },
        port,
      );
    });
  }

  private splice(tunnel: Tunnel, port: number): void {
    const { client, upstream } = tunnel;
    const started = performance.now();
    this.opened += 1;
    this.tunnels.add(tunnel);
    (client as Socket).setNoDelay?.(true);
    // A proxy that vanished without a FIN is noticed, so its tunnels do not pile up.
    (client as Socket).setKeepAlive?.(true, 30_000);
    let bytesToSandbox = 0;
    let bytesFromSandbox = 0;
    client.on("data", (chunk: Buffer) => {
      bytesToSandbox += chunk.length;
    });
    upstream.on("data", (chunk: Buffer) => {
      bytesFromSandbox += chunk.length;
    });
    let closed = false;
    const close = () => {
      if (closed) return;
      closed = true;
      this.tunnels.delete(tunnel);
      client.destroy();
      upstream.destroy();
      this.options.log.info("relay tunnel closed", {
        sandboxId: tunnel.sandboxId,
        exec: tunnel.exec,
        port,
        bytesToSandbox,
        bytesFromSandbox,
        ms: Math.round(performance.now() - started),
      });
    };
    upstream.on("error", close);
    client.on("error", close);
    client.once("close", close);
    upstream.once("close", close);
    // A half-close from either side is passed on; the tunnel ends when both sides are done.
    client.pipe(upstream);
    upstream.pipe(client);
  }

  /** Tunnels whose sandbox was killed, paused or replaced since they opened are cut. */
  private sweep(): void {
    for (const tunnel of this.tunnels) {
      const now = this.options.sandboxes.get(tunnel.sandboxId);
      if (!now || now.paused || now.exec !== tunnel.exec || now.sandboxAddr !== tunnel.addr) {
        tunnel.client.destroy();
        tunnel.upstream.destroy();
      }
    }
  }

  private refuse(client: Duplex, status: number, message: string, errorCode?: string): void {
    this.refused += 1;
    if (client.destroyed) return;
    const body = `${message}\n`;
    const extra = errorCode ? `${RELAY_ERROR_HEADER}: ${errorCode}\r\n` : "";
    client.end(
      `HTTP/1.1 ${status} ${REASONS[status] ?? "Error"}\r\n${extra}Content-Type: text/plain; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
    this.options.log.debug("relay refused", { status, reason: message });
  }
}

const REASONS: Record<number, string> = {
  400: "Bad Request",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  502: "Bad Gateway",
  504: "Gateway Timeout",
};

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

/** `a.b.c.d:port` with every octet ≤ 255 and port 1–65535; undefined for anything else. */
export function parseTarget(authority: string): { host: string; port: number } | undefined {
  const match = TARGET.exec(authority);
  if (!match) return undefined;
  const octets = match.slice(1, 5).map(Number);
  const port = Number(match[5]);
  if (octets.some((o) => o > 255) || port < 1 || port > 65535) return undefined;
  return { host: octets.join("."), port };
}
