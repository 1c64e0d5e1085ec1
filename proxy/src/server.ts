import { readFileSync } from "node:fs";
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import type { RouteEvent } from "@warren/proto/redis";
import { type Admission, header } from "./admission.js";
import type { ProxyConfig } from "./config.js";
import { EnvdIntercept } from "./envd-intercept.js";
import { sendRoutingFailure, writeSocketError } from "./errors.js";
import { Exchanges } from "./exchanges.js";
import type { ExecGate } from "./exec-gate.js";
import { Forwarder } from "./forward.js";
import { SandboxConnections } from "./limits.js";
import type { Logger } from "./log.js";
import type { ProxyMetrics } from "./metrics.js";
import { EnvdPrewarmer } from "./prewarm.js";
import { AutoResume, type SandboxResumer } from "./resume.js";
import { RouteAdmission } from "./route-admission.js";
import type { RouteStore } from "./routes.js";
import { Router, type RouteTarget, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER } from "./routing.js";
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
 * The data-plane edge: finds the sandbox a request addresses (routing.ts), has it admitted (route-admission.ts:
 * what E2B's proxy checks) and streams the exchange to the sandbox port (exchanges.ts). It owns the listener, the
 * drain at shutdown and the reaction to route events. It never runs anything.
 */
export class SandboxProxy {
  readonly server: Server;
  private readonly router: Router;
  private readonly forwarder: Forwarder;
  private readonly connections: SandboxConnections;
  private readonly admission: RouteAdmission;
  private readonly exchanges: Exchanges;
  private readonly unsubscribe: () => void;
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
    const autoResume = deps.resumer
      ? new AutoResume(deps.resumer, deps.routes, config.resumeTimeoutMs, log, (outcome) =>
          metrics.resumes.inc({ outcome }),
        )
      : undefined;
    this.admission = new RouteAdmission({ config, routes: deps.routes, metrics, log, autoResume });
    const prewarmer = config.prewarmEnvd
      ? new EnvdPrewarmer({ config, routes: deps.routes, forwarder: this.forwarder, metrics })
      : undefined;
    this.unsubscribe = deps.routes.onEvent((event) => {
      this.onRouteEvent(event);
      if (!this.draining) prewarmer?.onRouteEvent(event);
    });
    const envd = new EnvdIntercept({
      envdPort: config.envdPort,
      log,
      metrics,
      ...(deps.secretGrants ? { secretGrants: deps.secretGrants } : {}),
      ...(deps.execGate ? { execGate: deps.execGate } : {}),
    });
    this.exchanges = new Exchanges({
      config,
      metrics,
      log,
      forwarder: this.forwarder,
      connections: this.connections,
      envd,
      failed: (target, error) => this.failed(target, error),
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
    return this.admission.pendingResumes;
  }

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    const started = performance.now();
    const { metrics } = this.deps;
    if (this.draining) res.shouldKeepAlive = false;
    if (this.deps.config.apiUpstream && this.router.isApiHost(req.headers.host)) {
      this.exchanges.api(req, res, this.deps.config.apiUpstream, started);
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
        if ("error" in admission) this.exchanges.refuse(req, res, admission.error, started);
        else this.exchanges.http(req, res, target, admission, started);
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
          this.exchanges.upgrade(req, socket, head, target, admission.upstream, started);
        }
      });
    this.guarded(target, drop, () => this.decide(req, target, answer));
  }

  /** Admits the exchange (route-admission.ts): `answer` runs at once on a cache hit, else when the route is known. */
  private decide(req: IncomingMessage, target: RouteTarget, answer: (admission: Admission) => void): void {
    const admission = this.admission.decide(req, target);
    if (admission instanceof Promise) this.settle(target, admission, answer);
    else answer(admission);
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
}
