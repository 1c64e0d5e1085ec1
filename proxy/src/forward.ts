import {
  Agent,
  type ClientRequest,
  type ClientRequestArgs,
  type IncomingMessage,
  request,
  type ServerResponse,
} from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
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
}

/** `relay-refused`: a node agent refused the tunnel itself (wrong or missing relay token, relay off, bad answer). */
export type UpstreamErrorReason = "refused" | "reset" | "timeout" | "relay-refused" | "other";

export interface ForwarderOptions {
  readonly connectRetries: number;
  readonly connectTimeoutMs: number;
  readonly idleTimeoutMs: number;
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

interface UpstreamRequestArgs extends ClientRequestArgs {
  readonly warrenKey: string;
  readonly relayVia?: string;
}

/** Pools keep-alive connections per sandbox incarnation, so a resumed sandbox never gets an old one. */
class IncarnationAgent extends Agent {
  // Agent's own name plus the incarnation, built in one step: it runs twice per request (lookup and release).
  // Upstream requests never set localAddress, family or socketPath, the other parts of Agent's name.
  override getName(options?: ClientRequestArgs): string {
    const args = options as UpstreamRequestArgs | undefined;
    return `${args?.host ?? "localhost"}:${args?.port ?? ""}:|${args?.warrenKey ?? ""}`;
  }
}

/** Like IncarnationAgent, but every connection is a tunnel through the route's node agent. */
class RelayAgent extends IncarnationAgent {
  constructor(
    private readonly dialer: RelayDialer,
    options: ConstructorParameters<typeof Agent>[0],
  ) {
    super(options);
  }

  override createConnection(
    options: ClientRequestArgs,
    done?: (error: Error | null, stream: Duplex) => void,
  ): undefined {
    const args = options as UpstreamRequestArgs;
    openRelayTunnel(
      this.dialer,
      { nodeAddr: args.relayVia ?? "", host: String(args.host), port: Number(args.port) },
      done as TunnelCallback,
    );
    return undefined;
  }
}

/** Hop-by-hop headers (RFC 9110 §7.6.1) and the ones this proxy answers itself. */
// warren-secret-*: only this proxy may hand secrets to envd (secret-grants.ts), never a client.
const REQUEST_DROP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "upgrade",
  "expect",
  "warren-secret-grant",
  "warren-secret-env",
]);
const UPGRADE_REQUEST_DROP = new Set([
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "expect",
  "warren-secret-grant",
  "warren-secret-env",
]);
const RESPONSE_DROP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "trailer",
  "upgrade",
]);

function incarnationKey(upstream: Upstream): string {
  return `${upstream.sandboxId}|${upstream.exec}`;
}

/**
 * Streams HTTP/1.1 exchanges and upgraded connections between clients and sandboxes: bodies flow
 * chunk by chunk in both directions with backpressure, nothing is buffered, and an abort on either
 * side tears down the other.
 */
export class Forwarder {
  private readonly agent: IncarnationAgent;
  private readonly relayAgent: RelayAgent | undefined;
  private readonly dialer: RelayDialer | undefined;

  constructor(private readonly options: ForwarderOptions) {
    const poolOptions = { keepAlive: true, maxFreeSockets: options.maxIdlePerHost, scheduling: "lifo" } as const;
    this.agent = new IncarnationAgent(poolOptions);
    if (options.relayToken !== undefined) {
      this.dialer = { token: options.relayToken, timeoutMs: options.connectTimeoutMs };
      this.relayAgent = new RelayAgent(this.dialer, poolOptions);
    }
  }

  /** The pool for this upstream: direct, or tunnels through its node agent. */
  private agentFor(upstream: Upstream): IncarnationAgent {
    if (upstream.relayVia === undefined) return this.agent;
    if (!this.relayAgent) throw new Error("an upstream asks for the relay but no relay token is configured");
    return this.relayAgent;
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
    const drop = rewrite ? new Set([...REQUEST_DROP, "content-length", "transfer-encoding"]) : REQUEST_DROP;
    const headers = requestHeaders(req.rawHeaders, drop, upstream);
    if (rewrite) {
      for (const [name, value] of rewrite.headers) headers.push(name, value);
      headers.push("Content-Length", String(rewrite.body.length));
    }
    const hasBody =
      rewrite === undefined &&
      (req.headers["transfer-encoding"] !== undefined ||
        (req.headers["content-length"] !== undefined && req.headers["content-length"] !== "0"));
    let attempt = 0;
    let current: ClientRequest | undefined;
    let responded = false;
    let clientGone = false;

    res.once("close", () => {
      if (res.writableFinished) return;
      // The client went away (or the response was cut): the sandbox side must see it too.
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
        agent: this.agentFor(upstream),
        warrenKey: incarnationKey(upstream),
        relayVia: upstream.relayVia,
      } as UpstreamRequestArgs);
      current = upstreamReq;
      let bodyStarted = false;
      const bodiless = !rewrite && !hasBody;
      // Nothing to hold back until connected: the head goes out as soon as there is a socket.
      if (bodiless) upstreamReq.end();
      const startBody = () => {
        bodyStarted = true;
        if (rewrite) upstreamReq.end(rewrite.body);
        else if (hasBody) req.pipe(upstreamReq);
      };
      upstreamReq.once("socket", (socket: Socket) => {
        if (!socket.connecting) return bodiless ? undefined : startBody();
        const timer = setTimeout(
          () => upstreamReq.destroy(Object.assign(new Error("connect timeout"), { code: "ETIMEDOUT" })),
          this.options.connectTimeoutMs,
        );
        socket.once("connect", () => {
          clearTimeout(timer);
          if (!bodiless) startBody();
        });
        socket.once("close", () => clearTimeout(timer));
      });
      upstreamReq.once("response", (upstreamRes: IncomingMessage) => {
        responded = true;
        if (clientGone) {
          upstreamRes.destroy();
          return;
        }
        res.writeHead(
          upstreamRes.statusCode ?? 502,
          upstreamRes.statusMessage,
          responseHeaders(upstreamRes.rawHeaders, RESPONSE_DROP),
        );
        hooks.onResponse(upstreamRes.statusCode ?? 502);
        upstreamRes.once("close", () => {
          if (!upstreamRes.complete) {
            // The sandbox side broke mid-body: reset the client rather than end cleanly, so it
            // cannot mistake a truncated body for a whole one.
            hooks.onBroken("reset");
            res.destroy();
          }
        });
        upstreamRes.pipe(res);
      });
      upstreamReq.once("error", (error: NodeJS.ErrnoException) => {
        if (clientGone) return;
        const reason = errorReason(error);
        if (responded || res.headersSent) {
          hooks.onBroken(reason);
          res.destroy();
          return;
        }
        // A pooled connection the sandbox closed just as it was reused: replay if nothing was consumed.
        const staleReuse = upstreamReq.reusedSocket && reason === "reset" && (!hasBody || !bodyStarted);
        if (staleReuse) return send();
        if (reason === "refused" && !bodyStarted && attempt < this.options.connectRetries) {
          attempt += 1;
          setTimeout(() => {
            if (!clientGone) send();
          }, 100 * attempt);
          return;
        }
        if (hasBody) req.unpipe(upstreamReq);
        hooks.onUnreachable(reason);
      });
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

  /** Closes pooled connections of a sandbox's incarnations other than `keepExec` (all when undefined). */
  dropIdle(sandboxId: string, keepExec: string | undefined): void {
    const prefix = `|${sandboxId}|`;
    for (const agent of this.relayAgent ? [this.agent, this.relayAgent] : [this.agent]) {
      for (const [name, sockets] of Object.entries(agent.freeSockets)) {
        const at = name.lastIndexOf(prefix);
        if (at < 0 || name.length < at + prefix.length) continue;
        if (keepExec !== undefined && name.slice(at + prefix.length) === keepExec) continue;
        for (const socket of sockets ?? []) socket.destroy();
      }
    }
  }

  close(): void {
    this.agent.destroy();
    this.relayAgent?.destroy();
  }
}

/** Copies raw request headers minus `drop`, with Host masked when the route asks for it. */
function requestHeaders(raw: readonly string[], drop: ReadonlySet<string>, upstream: Upstream): string[] {
  const out: string[] = [];
  const extraDrop = connectionListed(raw);
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if (drop.has(lower) || extraDrop?.has(lower)) continue;
    if (lower === "host" && upstream.maskedHost !== undefined) {
      out.push("Host", upstream.maskedHost, "X-Forwarded-Host", raw[i + 1]!);
      continue;
    }
    if (lower === "x-forwarded-host" && upstream.maskedHost !== undefined) continue;
    out.push(name, raw[i + 1]!);
  }
  return out;
}

function responseHeaders(raw: readonly string[], drop: ReadonlySet<string>): string[] {
  const out: string[] = [];
  const extraDrop = connectionListed(raw);
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (drop.has(lower) || extraDrop?.has(lower)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

/** Headers a `Connection:` header names as hop-by-hop (besides the usual keep-alive/close/upgrade). */
function connectionListed(raw: readonly string[]): Set<string> | undefined {
  let listed: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.length !== 10 || raw[i]!.toLowerCase() !== "connection") continue;
    for (const token of raw[i + 1]!.split(",")) {
      const name = token.trim().toLowerCase();
      if (name === "" || name === "keep-alive" || name === "close" || name === "upgrade") continue;
      listed ??= new Set();
      listed.add(name);
    }
  }
  return listed;
}

function statusHead(res: IncomingMessage, headers: readonly string[]): string {
  let head = `HTTP/1.1 ${res.statusCode} ${res.statusMessage}\r\n`;
  for (let i = 0; i < headers.length; i += 2) head += `${headers[i]}: ${headers[i + 1]}\r\n`;
  return `${head}\r\n`;
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
      return "reset";
    case "ETIMEDOUT":
      return "timeout";
    case "ERELAYAUTH":
    case "ERELAYPROTO":
      return "relay-refused";
    default:
      return "other";
  }
}
