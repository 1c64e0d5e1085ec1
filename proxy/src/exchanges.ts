import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { SandboxRoute } from "@warren/proto/redis";
import type { ProxyConfig } from "./config.js";
import type { EnvdIntercept, InterceptedKind, Rewrite } from "./envd-intercept.js";
import { type ProxyError, sendProxyError, writeSocketError } from "./errors.js";
import type { Forwarder, Upstream } from "./forward.js";
import type { SandboxConnections } from "./limits.js";
import type { Logger } from "./log.js";
import type { ProxyMetrics } from "./metrics.js";
import type { RouteTarget } from "./routing.js";

export interface ExchangesDeps {
  readonly config: ProxyConfig;
  readonly metrics: ProxyMetrics;
  readonly log: Logger;
  readonly forwarder: Forwarder;
  readonly connections: SandboxConnections;
  readonly envd: EnvdIntercept;
  /** Logs a failure of one exchange's handling (a bug), which then drops only that exchange. */
  readonly failed: (target: RouteTarget, error: unknown) => void;
}

/**
 * Admitted exchanges on their way: each counted against its sandbox's connection limit, envd's intercepted
 * requests read first (envd-intercept.ts), streamed by the Forwarder, and measured (metrics, the access log);
 * refusals and an unreachable port answered with E2B's bodies. The api's host passes through unchecked.
 */
export class Exchanges {
  private requestCounter = 0;

  constructor(private readonly deps: ExchangesDeps) {}

  /** An admitted HTTP request: read by envd-intercept.ts first when it is one of envd's it checks. */
  http(
    req: IncomingMessage,
    res: ServerResponse,
    target: RouteTarget,
    admitted: { readonly upstream: Upstream; readonly route?: SandboxRoute },
    started: number,
  ): void {
    const kind = this.deps.envd.kindOf(req, target.port, admitted.route);
    if (kind) this.forwardIntercepted(kind, req, res, target, admitted.upstream, admitted.route, started);
    else this.forwardHttp(req, res, target, admitted.upstream, started);
  }

  /** An admitted WebSocket (or other) upgrade. */
  upgrade(
    req: IncomingMessage,
    socket: Duplex,
    head: Buffer,
    target: RouteTarget,
    upstream: Upstream,
    started: number,
  ): void {
    const { metrics, log, connections } = this.deps;
    const connection = connections.open(upstream.sandboxId, upstream.exec, () => socket.destroy());
    if (!connection) {
      const error: ProxyError = {
        kind: "too-many-connections",
        sandboxId: upstream.sandboxId,
        limit: connections.limit,
      };
      metrics.requests.inc({ kind: "websocket", status: writeSocketError(socket, req.headers, error) });
      return;
    }
    let switched = false;
    socket.once("close", () => connections.close(connection));
    this.deps.forwarder.upgrade(req, socket, head, upstream, {
      onResponse: (status) => {
        metrics.requests.inc({ kind: "websocket", status });
        metrics.latency.observe({ kind: "websocket" }, (performance.now() - started) / 1000);
        if (status === 101) {
          switched = true;
          metrics.openWebSockets.inc();
        }
      },
      onClosed: () => {
        if (switched) metrics.openWebSockets.dec();
        switched = false;
      },
      onUnreachable: (reason) => {
        metrics.upstreamErrors.inc({ reason });
        log.warn("sandbox port unreachable", { sandboxId: target.sandboxId, port: target.port, reason, upgrade: true });
        const error: ProxyError = { kind: "port-closed", sandboxId: target.sandboxId, port: target.port };
        metrics.requests.inc({ kind: "websocket", status: writeSocketError(socket, req.headers, error) });
      },
      onBroken: (reason) => metrics.upstreamErrors.inc({ reason }),
    });
  }

  /** `api.<domain>` with PROXY_API_URL set: a plain streaming pass-through, none of the sandbox checks. */
  api(
    req: IncomingMessage,
    res: ServerResponse,
    api: { readonly host: string; readonly port: number },
    started: number,
  ): void {
    const { metrics, log } = this.deps;
    // Pooled apart from every sandbox: route events name valid sandbox ids, never the empty one.
    const upstream: Upstream = {
      sandboxId: "",
      exec: "api",
      host: api.host,
      port: api.port,
      maskedHost: undefined,
      // The api builds links back to itself (upload URLs) from Host and this: https behind a TLS listener.
      forwardedProto: this.deps.config.tls ? "https" : "http",
    };
    this.deps.forwarder.http(req, res, upstream, {
      onResponse: (status) => {
        metrics.requests.inc({ kind: "api", status });
        metrics.latency.observe({ kind: "api" }, (performance.now() - started) / 1000);
      },
      onUnreachable: (reason) => {
        metrics.upstreamErrors.inc({ reason });
        log.warn("api unreachable", { reason });
        this.refuse(req, res, { kind: "api-unreachable" }, started);
      },
      onBroken: (reason) => metrics.upstreamErrors.inc({ reason }),
    });
  }

  /** Answers an HTTP request with E2B's error body (or drops it when its response has begun). */
  refuse(req: IncomingMessage, res: ServerResponse, error: ProxyError, started: number): void {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const status = sendProxyError(res, req.headers, error);
    this.deps.metrics.requests.inc({ kind: "http", status });
    this.deps.metrics.latency.observe({ kind: "http" }, (performance.now() - started) / 1000);
  }

  /** An envd request read before it goes on (envd-intercept.ts); refusals are answered there. */
  private forwardIntercepted(
    kind: InterceptedKind,
    req: IncomingMessage,
    res: ServerResponse,
    target: RouteTarget,
    upstream: Upstream,
    route: SandboxRoute | undefined,
    started: number,
  ): void {
    const abort = new AbortController();
    // Only while the request is read: aborting after that would make an AbortError (a DOMException with its
    // stack) for every envd call when its response closes, with nothing left to cancel.
    const onClose = () => abort.abort();
    res.once("close", onClose);
    this.deps.envd.prepare(kind, req, res, target.sandboxId, route, abort.signal).then(
      (rewrite) => {
        res.off("close", onClose);
        if (rewrite !== null && !res.destroyed) this.forwardHttp(req, res, target, upstream, started, rewrite);
      },
      (error: unknown) => {
        res.off("close", onClose);
        this.deps.failed(target, error);
      },
    );
  }

  private forwardHttp(
    req: IncomingMessage,
    res: ServerResponse,
    target: RouteTarget,
    upstream: Upstream,
    started: number,
    rewrite?: Rewrite,
  ): void {
    const { metrics, log, config, connections } = this.deps;
    const connection = connections.open(upstream.sandboxId, upstream.exec, () => res.destroy());
    if (!connection) {
      const error: ProxyError = {
        kind: "too-many-connections",
        sandboxId: upstream.sandboxId,
        limit: connections.limit,
      };
      this.refuse(req, res, error, started);
      return;
    }
    metrics.inFlightRequests.inc();
    // Made only when a log line needs it (most requests log nothing).
    let id: string | undefined;
    const requestId = () => {
      id ??= this.nextRequestId();
      return id;
    };
    const where = () => ({ requestId: requestId(), sandboxId: target.sandboxId, port: target.port });
    res.once("close", () => {
      connections.close(connection);
      metrics.inFlightRequests.dec();
      if (config.accessLog) {
        log.info("request", {
          ...where(),
          method: req.method,
          status: res.statusCode,
          complete: res.writableFinished,
          ms: Math.round(performance.now() - started),
        });
      }
    });
    this.deps.forwarder.http(
      req,
      res,
      upstream,
      {
        onResponse: (status) => {
          metrics.requests.inc({ kind: "http", status });
          metrics.latency.observe({ kind: "http" }, (performance.now() - started) / 1000);
        },
        onUnreachable: (reason) => {
          metrics.upstreamErrors.inc({ reason });
          log.warn("sandbox port unreachable", { ...where(), reason });
          this.refuse(req, res, { kind: "port-closed", sandboxId: target.sandboxId, port: target.port }, started);
        },
        onBroken: (reason) => {
          metrics.upstreamErrors.inc({ reason });
          log.warn("stream broken by the sandbox side", { ...where(), reason });
        },
      },
      rewrite,
    );
  }

  private nextRequestId(): string {
    this.requestCounter += 1;
    return `${process.pid.toString(36)}-${this.requestCounter.toString(36)}`;
  }
}
