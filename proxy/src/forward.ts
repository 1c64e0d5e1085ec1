import {
  type ClientRequest,
  type ClientRequestArgs,
  type IncomingMessage,
  request,
  type ServerResponse,
} from "node:http";
import type { Socket } from "node:net";
import { type Duplex, Readable } from "node:stream";
import { Pool } from "undici";
import {
  latin1Headers,
  REQUEST_DROP,
  RESPONSE_DROP,
  REWRITE_REQUEST_DROP,
  requestHeaders,
  responseHeaders,
  statusHead,
  UPGRADE_REQUEST_DROP,
} from "./forward-headers.js";
import { openRelayTunnel, type RelayDialer, type TunnelCallback } from "./relay.js";

/** Where one request goes: a sandbox port, reached as host:port, in one incarnation. */
export interface Upstream {
  readonly sandboxId: string;
  /** The route's `exec`: pooled connections are never shared across incarnations. */
  readonly exec: string;
  readonly host: string;
  readonly port: number;
  /** Host header to send instead of the client's (maskRequestHost); the original goes in X-Forwarded-Host. */
  readonly maskedHost: string | undefined;
  /** The node agent (host:port) to tunnel through (its relay); undefined: connect to host:port directly. */
  readonly relayVia?: string;
  /**
   * The scheme the client reached this proxy with, sent as `X-Forwarded-Proto` (the client's own is dropped): the
   * api's pass-through only, whose answers hold URLs back to itself (a COPY step's upload link).
   */
  readonly forwardedProto?: "http" | "https";
}

/** `relay-refused`: a node agent refused the tunnel itself (wrong or missing relay token, relay off, bad answer). */
export type UpstreamErrorReason = "refused" | "reset" | "timeout" | "relay-refused" | "other";

export interface ForwarderOptions {
  readonly connectRetries: number;
  readonly connectTimeoutMs: number;
  readonly idleTimeoutMs: number;
  /** 0: no keep-alive to sandboxes; any other value: keep-alive (idle connections close after 4 s). */
  readonly maxIdlePerHost: number;
  /** The node agents' relay token; needed only when some upstream has `relayVia`. */
  readonly relayToken?: string;
}

export interface ForwardHooks {
  /** The sandbox could not be reached before any response: answer 502 port-closed. */
  onUnreachable(reason: UpstreamErrorReason): void;
  /** Response headers reached the client (status from the sandbox). */
  onResponse(status: number): void;
  /** The exchange broke after it started (either side reset it). */
  onBroken(reason: UpstreamErrorReason): void;
}

/** A sandbox's pools are named `<sandboxId>|<exec>|<relay>|<host>:<port>`, so an incarnation's are found by prefix. */
function poolKey(upstream: Upstream): string {
  return `${upstream.sandboxId}|${upstream.exec}|${upstream.relayVia ?? ""}|${upstream.host}:${upstream.port}`;
}

// A keep-alive connection the sandbox closed just as it was reused fails like this; resent at most this often.
const MAX_STALE_RESENDS = 1;

/**
 * Streams HTTP/1.1 exchanges and upgraded connections between clients and sandboxes: bodies flow
 * chunk by chunk in both directions with backpressure, nothing is buffered, and an abort on either
 * side tears down the other.
 */
export class Forwarder {
  /** Keep-alive pools, one per upstream address and sandbox incarnation (poolKey). */
  private readonly pools = new Map<string, Pool>();
  private readonly dialer: RelayDialer | undefined;
  private closed = false;

  constructor(private readonly options: ForwarderOptions) {
    if (options.relayToken !== undefined) {
      this.dialer = { token: options.relayToken, timeoutMs: options.connectTimeoutMs };
    }
  }

  /**
   * The pool for this upstream: direct connections, or tunnels through its node agent. undici's client, not
   * http.Agent: it costs about half the CPU per request (bench/run.mjs, "minimal undici proxy").
   */
  private poolFor(upstream: Upstream): Pool {
    const key = poolKey(upstream);
    const existing = this.pools.get(key);
    if (existing) return existing;
    const via = upstream.relayVia;
    const dialer = this.dialer;
    if (via !== undefined && !dialer)
      throw new Error("an upstream asks for the relay but no relay token is configured");
    const pool = new Pool(
      `http://${upstream.host.includes(":") ? `[${upstream.host}]` : upstream.host}:${upstream.port}`,
      {
        // Streams may run for hours: idleness on the client's side ends them (server.timeout), not these.
        headersTimeout: 0,
        bodyTimeout: 0,
        // 0 idle connections wanted: no keep-alive at all. Otherwise an idle connection closes after 4 s unused
        // (or the sandbox's Keep-Alive hint); undici has no cap on how many stay idle meanwhile.
        pipelining: this.options.maxIdlePerHost === 0 ? 0 : 1,
        connections: null,
        keepAliveTimeout: 4_000,
        connect:
          via === undefined
            ? { timeout: this.options.connectTimeoutMs, noDelay: true }
            : (_options, done) =>
                openRelayTunnel(
                  dialer!,
                  { nodeAddr: via, host: upstream.host, port: upstream.port },
                  (error, socket) => (error ? done(error, null) : done(null, socket as Socket)),
                ),
      },
    );
    // A pool with nothing open or queued is forgotten, so sandboxes that went away leave nothing behind.
    pool.on("disconnect", () => {
      const stats = pool.stats;
      if (stats.connected === 0 && stats.pending === 0 && stats.running === 0 && this.pools.get(key) === pool) {
        this.pools.delete(key);
        void pool.close();
      }
    });
    this.pools.set(key, pool);
    return pool;
  }

  /**
   * Forwards `req` and streams the answer into `res`. With `rewrite`, the request's body was already read: `body`
   * is sent instead (with its own length) and `headers` are added.
   */
  http(
    req: IncomingMessage,
    res: ServerResponse,
    upstream: Upstream,
    hooks: ForwardHooks,
    rewrite?: { readonly headers: readonly [string, string][]; readonly body: Buffer },
  ): void {
    const drop = rewrite ? REWRITE_REQUEST_DROP : REQUEST_DROP;
    const headers = requestHeaders(req.rawHeaders, drop, upstream);
    if (rewrite) for (const [name, value] of rewrite.headers) headers.push(name, value);
    const hasBody =
      rewrite === undefined &&
      (req.headers["transfer-encoding"] !== undefined ||
        (req.headers["content-length"] !== undefined && req.headers["content-length"] !== "0"));
    let attempt = 0;
    let staleResends = 0;
    let abortCurrent: ((reason?: Error) => void) | undefined;
    let responded = false;
    let clientGone = false;
    let bodyStarted = false;

    res.once("close", () => {
      if (res.writableFinished) return;
      // The client went away (or the response was cut): the sandbox side must see it too.
      clientGone = true;
      abortCurrent?.();
    });

    const send = (): void => {
      let pool: Pool;
      try {
        pool = this.poolFor(upstream);
      } catch (error) {
        hooks.onUnreachable(errorReason(error as NodeJS.ErrnoException));
        return;
      }
      const body = rewrite
        ? rewrite.body
        : hasBody
          ? deferredBody(req, () => {
              bodyStarted = true;
            })
          : null;
      pool.dispatch(
        { path: req.url ?? "/", method: req.method ?? "GET", headers, body },
        {
          onConnect: (abort: (reason?: Error) => void) => {
            abortCurrent = abort;
            if (clientGone) abort();
          },
          onHeaders: (status: number, raw: Buffer[], resume: () => void, statusText: string) => {
            responded = true;
            if (clientGone) return false;
            res.writeHead(status, statusText, responseHeaders(latin1Headers(raw), RESPONSE_DROP));
            res.on("drain", resume);
            hooks.onResponse(status);
            return true;
          },
          onData: (chunk: Buffer) => res.write(chunk),
          onComplete: () => {
            res.end();
          },
          onError: (error: Error) => {
            if (clientGone) return;
            const reason = errorReason(error as NodeJS.ErrnoException);
            if (responded || res.headersSent) {
              // The sandbox side broke mid-body: reset the client rather than end cleanly, so it
              // cannot mistake a truncated body for a whole one.
              hooks.onBroken(reason);
              res.destroy();
              return;
            }
            // A pooled connection the sandbox closed just as it was reused: replay if nothing was consumed.
            if (reason === "reset" && !bodyStarted && staleResends < MAX_STALE_RESENDS) {
              staleResends += 1;
              return send();
            }
            if (reason === "refused" && !bodyStarted && attempt < this.options.connectRetries) {
              attempt += 1;
              setTimeout(() => {
                if (!clientGone) send();
              }, 100 * attempt);
              return;
            }
            hooks.onUnreachable(reason);
          },
        },
      );
    };
    send();
  }

  /**
   * Forwards an upgrade request (WebSocket). On 101 the two sockets are spliced; any other answer
   * from the sandbox is relayed and the connection closed.
   */
  upgrade(
    req: IncomingMessage,
    socket: Duplex,
    head: Buffer,
    upstream: Upstream,
    hooks: ForwardHooks & { onClosed(): void },
  ): void {
    const headers = requestHeaders(req.rawHeaders, UPGRADE_REQUEST_DROP, upstream);
    let attempt = 0;
    let current: ClientRequest | undefined;
    let clientGone = false;
    socket.once("close", () => {
      clientGone = true;
      current?.destroy();
    });

    const send = (): void => {
      const upstreamReq = request({
        host: upstream.host,
        port: upstream.port,
        method: req.method,
        path: req.url,
        headers,
        // No agent at all for a tunnel: node:http uses `createConnection` only then (`agent: false` makes one).
        ...(upstream.relayVia === undefined ? { agent: false } : this.tunnelFor(upstream)),
        timeout: this.options.connectTimeoutMs,
      });
      current = upstreamReq;
      upstreamReq.once("timeout", () =>
        upstreamReq.destroy(Object.assign(new Error("connect timeout"), { code: "ETIMEDOUT" })),
      );
      upstreamReq.once("upgrade", (upstreamRes: IncomingMessage, upstreamSocket: Socket, upstreamHead: Buffer) => {
        upstreamSocket.setTimeout(0);
        if (clientGone) {
          upstreamSocket.destroy();
          return;
        }
        socket.write(statusHead(upstreamRes, responseHeaders(upstreamRes.rawHeaders, new Set())));
        hooks.onResponse(upstreamRes.statusCode ?? 101);
        if (upstreamHead.length > 0) socket.write(upstreamHead);
        if (head.length > 0) upstreamSocket.write(head);
        splice(socket, upstreamSocket, this.options.idleTimeoutMs, hooks.onClosed);
      });
      upstreamReq.once("response", (upstreamRes: IncomingMessage) => {
        // The sandbox declined the upgrade: relay its answer, delimited by closing the connection.
        const headers = responseHeaders(upstreamRes.rawHeaders, new Set([...RESPONSE_DROP, "content-length"]));
        headers.push("Connection", "close");
        socket.write(statusHead(upstreamRes, headers));
        hooks.onResponse(upstreamRes.statusCode ?? 502);
        upstreamRes.once("close", () => {
          if (!upstreamRes.complete) socket.destroy();
        });
        upstreamRes.pipe(socket);
      });
      upstreamReq.once("error", (error: NodeJS.ErrnoException) => {
        if (clientGone) return;
        const reason = errorReason(error);
        if (reason === "refused" && attempt < this.options.connectRetries) {
          attempt += 1;
          setTimeout(() => {
            if (!clientGone) send();
          }, 100 * attempt);
          return;
        }
        hooks.onUnreachable(reason);
      });
      upstreamReq.end();
    };
    send();
  }

  /** For an unpooled request (upgrade): a `createConnection` that tunnels through the relay when asked. */
  private tunnelFor(upstream: Upstream): Pick<ClientRequestArgs, "createConnection"> {
    const via = upstream.relayVia ?? "";
    const dialer = this.dialer;
    if (!dialer) throw new Error("an upstream asks for the relay but no relay token is configured");
    return {
      createConnection: ((_options: ClientRequestArgs, done: TunnelCallback) => {
        openRelayTunnel(dialer, { nodeAddr: via, host: upstream.host, port: upstream.port }, done);
        return undefined;
      }) as unknown as ClientRequestArgs["createConnection"],
    };
  }

  /**
   * Opens a kept-alive connection to `upstream` before its first request: a GET of `path`, its answer discarded.
   * Nothing when a connection is open already, keep-alive is off, or the upstream is behind a relay. Never rejects.
   */
  async prewarm(upstream: Upstream, path: string): Promise<"opened" | "skipped" | "failed"> {
    if (this.closed || this.options.maxIdlePerHost === 0 || upstream.relayVia !== undefined) return "skipped";
    const key = poolKey(upstream);
    if ((this.pools.get(key)?.stats.connected ?? 0) > 0) return "skipped";
    const pool = this.poolFor(upstream);
    try {
      const answer = await pool.request({
        path,
        method: "GET",
        signal: AbortSignal.timeout(this.options.connectTimeoutMs),
      });
      await answer.body.dump();
      return "opened";
    } catch {
      // A pool that never connected is forgotten, as one is after its last connection closes.
      const stats = pool.stats;
      if (stats.connected === 0 && stats.pending === 0 && stats.running === 0 && this.pools.get(key) === pool) {
        this.pools.delete(key);
        void pool.close();
      }
      return "failed";
    }
  }

  /**
   * Closes the pools of a sandbox's incarnations other than `keepExec` (all when undefined). Their exchanges in
   * flight are cut by the caller (SandboxConnections) for the same reason, so nothing open is lost here.
   */
  dropIdle(sandboxId: string, keepExec: string | undefined): void {
    const prefix = `${sandboxId}|`;
    for (const [key, pool] of this.pools) {
      if (!key.startsWith(prefix)) continue;
      if (keepExec !== undefined && key.startsWith(`${prefix}${keepExec}|`)) continue;
      this.pools.delete(key);
      void pool.destroy().catch(() => {});
    }
  }

  close(): void {
    this.closed = true;
    for (const pool of this.pools.values()) void pool.destroy().catch(() => {});
    this.pools.clear();
  }
}

/**
 * The client's body as a stream the upstream client may consume, or destroy on a failed attempt, without
 * touching `req` before its first read. That read comes only once connected, so a refused attempt can be
 * retried with the body intact.
 */
function deferredBody(req: IncomingMessage, onStart: () => void): Readable {
  let started = false;
  const onData = (chunk: Buffer) => {
    if (!body.push(chunk)) req.pause();
  };
  const onEnd = () => body.push(null);
  const onAborted = () => body.destroy(Object.assign(new Error("client aborted the request"), { code: "ECONNRESET" }));
  const detach = () => {
    req.off("data", onData);
    req.off("end", onEnd);
    req.off("error", onAborted);
    req.off("aborted", onAborted);
  };
  const body: Readable = new Readable({
    read() {
      if (!started) {
        started = true;
        onStart();
        req.on("data", onData);
        req.once("end", onEnd);
        req.once("error", onAborted);
        req.once("aborted", onAborted);
      }
      req.resume();
    },
    destroy(error, callback) {
      detach();
      callback(error);
    },
  });
  return body;
}

/** Pipes two sockets into each other until either closes, errors or idles out. */
function splice(client: Duplex, upstream: Socket, idleTimeoutMs: number, onClosed: () => void): void {
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    client.destroy();
    upstream.destroy();
    onClosed();
  };
  const clientSocket = client as Socket;
  clientSocket.setNoDelay?.(true);
  upstream.setNoDelay(true);
  clientSocket.setTimeout?.(idleTimeoutMs, close);
  client.on("error", close);
  upstream.on("error", close);
  client.once("close", close);
  upstream.once("close", close);
  // A half-close from one side is passed on; the connection ends when both sides are done.
  client.pipe(upstream);
  upstream.pipe(client);
}

function errorReason(error: NodeJS.ErrnoException): UpstreamErrorReason {
  switch (error.code) {
    case "ECONNREFUSED":
    case "EHOSTUNREACH":
    case "ENETUNREACH":
    case "EADDRNOTAVAIL":
      return "refused";
    case "ECONNRESET":
    case "EPIPE":
    case "UND_ERR_SOCKET":
      return "reset";
    case "ETIMEDOUT":
    case "UND_ERR_CONNECT_TIMEOUT":
      return "timeout";
    case "ERELAYAUTH":
    case "ERELAYPROTO":
      return "relay-refused";
    default:
      return "other";
  }
}
