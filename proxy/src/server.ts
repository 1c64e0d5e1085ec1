import { readFileSync } from "node:fs";
import {
  createServer as createHttpServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import type { RouteEvent, SandboxRoute } from "@warren/proto/redis";
import { type Admission, admit, type Decision, header } from "./admission.js";
import type { ProxyConfig } from "./config.js";
import { EnvdIntercept, type InterceptedKind, type Rewrite } from "./envd-intercept.js";
import {
  type ProxyError,
  sendProxyError,
  sendRoutingFailure,
  TRAFFIC_TOKEN_HEADER,
  writeSocketError,
} from "./errors.js";
import type { ExecGate } from "./exec-gate.js";
import { Forwarder, type Upstream } from "./forward.js";
import { SandboxConnections } from "./limits.js";
import type { Logger } from "./log.js";
import type { ProxyMetrics } from "./metrics.js";
import { AutoResume, type SandboxResumer } from "./resume.js";
import type { RouteStore } from "./routes.js";
import { controlOnlyPath, Router, type RouteTarget, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER } from "./routing.js";
import type { SecretGrantRedeemer } from "./secret-grants.js";

export interface SandboxProxyDeps {
  readonly config: ProxyConfig;
  readonly routes: RouteStore;
  readonly metrics: ProxyMetrics;
  readonly log: Logger;
  /** The control plane's resume call; without one, paused sandboxes answer 502 like E2B's without auto-resume. */
  readonly resumer?: SandboxResumer;
  /** Redeems secret grants carried by envd Start requests (the api's internal path). */
  readonly secretGrants?: SecretGrantRedeemer;
  /** Enforces teams' exec policies on envd starts and file writes (exec-gate.ts); none: E2B's behaviour. */
  readonly execGate?: ExecGate;
}

/**
 * The data-plane edge: finds the sandbox a request addresses, checks what E2B's proxy checks,
 * and streams the exchange to the sandbox port. It never runs anything.
 */
export class SandboxProxy {
  readonly server: Server;
  private readonly router: Router;
  private readonly forwarder: Forwarder;
  private readonly connections: SandboxConnections;
  private readonly autoResume: AutoResume | undefined;
  private readonly envd: EnvdIntercept;
  private readonly unsubscribe: () => void;
  private requestCounter = 0;
  private draining = false;

  constructor(private readonly deps: SandboxProxyDeps) {
    const { config, metrics, log } = deps;
    this.router = new Router(config);
    this.forwarder = new Forwarder({
      connectRetries: config.upstreamConnectRetries,
      connectTimeoutMs: config.upstreamConnectTimeoutMs,
      idleTimeoutMs: config.idleTimeoutMs,
      maxIdlePerHost: config.upstreamMaxIdlePerHost,
      ...(config.relayToken !== undefined ? { relayToken: config.relayToken } : {}),
    });
    this.connections = new SandboxConnections(config.maxConnectionsPerSandbox);
    this.autoResume = deps.resumer
      ? new AutoResume(deps.resumer, deps.routes, config.resumeTimeoutMs, log, (outcome) =>
          metrics.resumes.inc({ outcome }),
        )
      : undefined;
    this.unsubscribe = deps.routes.onEvent((event) => this.onRouteEvent(event));
    this.envd = new EnvdIntercept({
      envdPort: config.envdPort,
      log,
      metrics,
      ...(deps.secretGrants ? { secretGrants: deps.secretGrants } : {}),
      ...(deps.execGate ? { execGate: deps.execGate } : {}),
    });

    const options = {
      // Streams may run for hours; idleness, not age, ends a connection.
      requestTimeout: 0,
      headersTimeout: 60_000,
      keepAliveTimeout: config.idleTimeoutMs,
      noDelay: true,
    };
    this.server = config.tls
      ? createHttpsServer({
          ...options,
          cert: readFileSync(config.tls.certFile),
          key: readFileSync(config.tls.keyFile),
        })
      : createHttpServer(options);
    this.server.timeout = config.idleTimeoutMs;
    this.server.on("request", (req: IncomingMessage, res: ServerResponse) => this.onRequest(req, res));
    this.server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) =>
      this.onUpgrade(req, socket, head),
    );
    this.server.on("clientError", (error: NodeJS.ErrnoException, socket: Duplex) => {
      if (socket.writable && error.code !== "ECONNRESET") {
        socket.end("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
      } else {
        socket.destroy();
      }
    });
  }

  listen(): Promise<AddressInfo> {
    const { host, port } = this.deps.config;
    return new Promise((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(port, host, () => {
        this.server.off("error", reject);
        resolve(this.server.address() as AddressInfo);
      });
    });
  }

  /** Stops accepting, lets in-flight requests and streams finish (at most drainTimeoutMs), then cuts the rest. */
  async close(): Promise<void> {
    this.draining = true;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const idleSweep = setInterval(() => this.server.closeIdleConnections(), 100);
    this.server.closeIdleConnections();
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), this.deps.config.drainTimeoutMs);
    });
    const result = await Promise.race([closed.then(() => "drained" as const), deadline]);
    clearInterval(idleSweep);
    clearTimeout(timer);
    if (result === "timeout") {
      this.deps.log.warn("drain timeout: cutting remaining connections", { open: this.connections.total });
      this.connections.cutAll();
      this.server.closeAllConnections();
      await closed;
    }
    this.unsubscribe();
    this.forwarder.close();
  }

  get openConnections(): number {
    return this.connections.total;
  }

  /** Sandboxes whose auto-resume requests are waiting on. */
  get pendingResumes(): number {
    return this.autoResume?.pending ?? 0;
  }

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    const started = performance.now();
    const { metrics } = this.deps;
    if (this.draining) res.shouldKeepAlive = false;
    if (this.deps.config.apiUpstream && this.router.isApiHost(req.headers.host)) {
      this.forwardApi(req, res, this.deps.config.apiUpstream, started);
      return;
    }
    const target = this.router.resolve(
      req.headers.host,
      header(req.headers, SANDBOX_ID_HEADER),
      header(req.headers, SANDBOX_PORT_HEADER),
    );
    if (typeof target === "string") {
      metrics.requests.inc({ kind: "http", status: sendRoutingFailure(res, target) });
      return;
    }
    const drop = () => res.destroy();
    const answer = (admission: Admission) =>
      this.guarded(target, drop, () => {
        if (res.destroyed) return;
        if ("error" in admission) {
          this.answerHttp(req, res, admission.error, started);
          return;
        }
        const kind = this.envd.kindOf(req, target.port, admission.route);
        if (kind) this.forwardIntercepted(kind, req, res, target, admission.upstream, admission.route, started);
        else this.forwardHttp(req, res, target, admission.upstream, started);
      });
    this.guarded(target, drop, () => this.decide(req, target, answer));
  }

  private onUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const started = performance.now();
    const { metrics } = this.deps;
    socket.on("error", () => socket.destroy());
    const target = this.router.resolve(
      req.headers.host,
      header(req.headers, SANDBOX_ID_HEADER),
      header(req.headers, SANDBOX_PORT_HEADER),
    );
    if (typeof target === "string") {
      metrics.requests.inc({ kind: "websocket", status: writeSocketError(socket, req.headers, target) });
      return;
    }
    const drop = () => socket.destroy();
    const answer = (admission: Admission) =>
      this.guarded(target, drop, () => {
        if (socket.destroyed) return;
        if ("error" in admission) {
          metrics.requests.inc({ kind: "websocket", status: writeSocketError(socket, req.headers, admission.error) });
        } else {
          this.forwardUpgrade(req, socket, head, target, admission.upstream, started);
        }
      });
    this.guarded(target, drop, () => this.decide(req, target, answer));
  }

  /**
   * Everything E2B's proxy checks before forwarding, in its order: control-only envd paths,
   * the route, the traffic token, the sandbox state (auto-resume). Synchronous on a cache hit.
   */
  private decide(req: IncomingMessage, target: RouteTarget, answer: (admission: Admission) => void): void {
    if (target.port === this.deps.config.envdPort) {
      const path = controlOnlyPath(req.url ?? "/");
      if (path !== undefined) {
        answer({ error: { kind: "control-only-path", path } });
        return;
      }
    }
    const hit = this.deps.routes.peek(target.sandboxId);
    if (hit) {
      const decision = this.check(target, hit.route, req.headers);
      if (!("resume" in decision)) {
        answer(decision);
        return;
      }
      this.settle(target, this.resume(req, target, decision.resume), answer);
      return;
    }
    this.settle(target, this.lookup(req, target), answer);
  }

  /** `answer` guards itself; lookup and resume never reject, so this catch is only a last resort. */
  private settle(target: RouteTarget, admission: Promise<Admission>, answer: (admission: Admission) => void): void {
    admission.then(answer).catch((error: unknown) => this.failed(target, error));
  }

  /** Runs one exchange's setup; a bug there drops that exchange (logged), never the process. */
  private guarded(target: RouteTarget, drop: () => void, run: () => void): void {
    try {
      run();
    } catch (error) {
      this.failed(target, error);
      drop();
    }
  }

  private failed(target: RouteTarget, error: unknown): void {
    this.deps.log.error("request handling failed", {
      sandboxId: target.sandboxId,
      port: target.port,
      error: error instanceof Error ? error.message : String(error),
    });
  }

  private async lookup(req: IncomingMessage, target: RouteTarget): Promise<Admission> {
    let route: SandboxRoute | undefined;
    try {
      route = await this.deps.routes.get(target.sandboxId);
    } catch (error) {
      this.deps.metrics.routeErrors.inc();
      this.deps.log.error("route lookup failed", {
        sandboxId: target.sandboxId,
        error: error instanceof Error ? error.message : String(error),
      });
      return { error: { kind: "sandbox-not-found", sandboxId: target.sandboxId } };
    }
    const decision = this.check(target, route, req.headers);
    return "resume" in decision ? this.resume(req, target, decision.resume) : decision;
  }

  private async resume(req: IncomingMessage, target: RouteTarget, route: SandboxRoute): Promise<Admission> {
    const outcome = await this.autoResume!.ensureRunning(route, {
      port: target.port,
      trafficAccessToken: header(req.headers, TRAFFIC_TOKEN_HEADER),
      envdAccessToken: header(req.headers, "x-access-token"),
    });
    if ("error" in outcome) return outcome;
    const decision = this.check(target, outcome.route, req.headers);
    return "resume" in decision ? { error: { kind: "still-transitioning", sandboxId: target.sandboxId } } : decision;
  }

  private check(target: RouteTarget, route: SandboxRoute | undefined, headers: IncomingHttpHeaders): Decision {
    return admit(this.deps.config, target, route, headers, this.autoResume !== undefined);
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
    res.once("close", () => abort.abort());
    this.envd.prepare(kind, req, res, target.sandboxId, route, abort.signal).then(
      (rewrite) => {
        if (rewrite !== null && !res.destroyed) this.forwardHttp(req, res, target, upstream, started, rewrite);
      },
      (error: unknown) => this.failed(target, error),
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
    const { metrics, log, config } = this.deps;
    const connection = this.connections.open(upstream.sandboxId, upstream.exec, () => res.destroy());
    if (!connection) {
      this.answerHttp(
        req,
        res,
        { kind: "too-many-connections", sandboxId: upstream.sandboxId, limit: this.connections.limit },
        started,
      );
      return;
    }
    metrics.inFlightRequests.inc();
    // Made only when a log line needs it (most requests log nothing).
    let id: string | undefined;
    const requestId = () => {
      id ??= this.nextRequestId();
      return id;
    };
    res.once("close", () => {
      this.connections.close(connection);
      metrics.inFlightRequests.dec();
      if (config.accessLog) {
        log.info("request", {
          requestId: requestId(),
          sandboxId: target.sandboxId,
          port: target.port,
          method: req.method,
          status: res.statusCode,
          complete: res.writableFinished,
          ms: Math.round(performance.now() - started),
        });
      }
    });
    this.forwarder.http(
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
          log.warn("sandbox port unreachable", {
            requestId: requestId(),
            sandboxId: target.sandboxId,
            port: target.port,
            reason,
          });
          this.answerHttp(req, res, { kind: "port-closed", sandboxId: target.sandboxId, port: target.port }, started);
        },
        onBroken: (reason) => {
          metrics.upstreamErrors.inc({ reason });
          log.warn("stream broken by the sandbox side", {
            requestId: requestId(),
            sandboxId: target.sandboxId,
            port: target.port,
            reason,
          });
        },
      },
      rewrite,
    );
  }

  private forwardUpgrade(
    req: IncomingMessage,
    socket: Duplex,
    head: Buffer,
    target: RouteTarget,
    upstream: Upstream,
    started: number,
  ): void {
    const { metrics, log } = this.deps;
    const connection = this.connections.open(upstream.sandboxId, upstream.exec, () => socket.destroy());
    if (!connection) {
      const error: ProxyError = {
        kind: "too-many-connections",
        sandboxId: upstream.sandboxId,
        limit: this.connections.limit,
      };
      metrics.requests.inc({ kind: "websocket", status: writeSocketError(socket, req.headers, error) });
      return;
    }
    let switched = false;
    socket.once("close", () => this.connections.close(connection));
    this.forwarder.upgrade(req, socket, head, upstream, {
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
  private forwardApi(
    req: IncomingMessage,
    res: ServerResponse,
    api: { readonly host: string; readonly port: number },
    started: number,
  ): void {
    const { metrics, log } = this.deps;
    // Pooled apart from every sandbox: route events name valid sandbox ids, never the empty one.
    const upstream: Upstream = { sandboxId: "", exec: "api", host: api.host, port: api.port, maskedHost: undefined };
    this.forwarder.http(req, res, upstream, {
      onResponse: (status) => {
        metrics.requests.inc({ kind: "api", status });
        metrics.latency.observe({ kind: "api" }, (performance.now() - started) / 1000);
      },
      onUnreachable: (reason) => {
        metrics.upstreamErrors.inc({ reason });
        log.warn("api unreachable", { reason });
        this.answerHttp(req, res, { kind: "api-unreachable" }, started);
      },
      onBroken: (reason) => metrics.upstreamErrors.inc({ reason }),
    });
  }

  private answerHttp(req: IncomingMessage, res: ServerResponse, error: ProxyError, started: number): void {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const status = sendProxyError(res, req.headers, error);
    this.deps.metrics.requests.inc({ kind: "http", status });
    this.deps.metrics.latency.observe({ kind: "http" }, (performance.now() - started) / 1000);
  }

  /** A sandbox was killed, paused or replaced by a new incarnation: its old streams and pooled connections go. */
  private onRouteEvent(event: RouteEvent): void {
    const gone = event.state === "deleted" || event.state === "paused";
    const stale = (exec: string) => gone || exec !== event.exec;
    this.forwarder.dropIdle(event.sandboxId, gone ? undefined : event.exec);
    const cut = this.connections.cut(event.sandboxId, stale);
    if (cut > 0) {
      this.deps.log.info("reset streams of a stopped incarnation", {
        sandboxId: event.sandboxId,
        state: event.state,
        exec: event.exec,
        streams: cut,
      });
    }
  }

  private nextRequestId(): string {
    this.requestCounter += 1;
    return `${process.pid.toString(36)}-${this.requestCounter.toString(36)}`;
  }
}
