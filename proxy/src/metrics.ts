import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";

/**
 * The proxy's Prometheus metrics. Labels never carry sandbox ids (unbounded cardinality);
 * per-sandbox detail belongs in logs.
 */
export class ProxyMetrics {
  readonly registry: Registry;
  /** Requests answered, by kind (http|websocket) and status code (the proxy's or the sandbox's). */
  readonly requests: Counter<"kind" | "status">;
  /** From request arrival to response headers sent (or WebSocket switched), by kind. */
  readonly latency: Histogram<"kind">;
  /** Failures talking to a sandbox, by reason (refused, reset, timeout, relay-refused, other). */
  readonly upstreamErrors: Counter<"reason">;
  /** Route lookups answered from the in-process cache (hit) or from Redis (miss). */
  readonly routeLookups: Counter<"result">;
  /** Route lookups that failed (Redis down or slow). */
  readonly routeErrors: Counter;
  readonly openWebSockets: Gauge;
  readonly inFlightRequests: Gauge;
  /** Auto-resumes, by outcome (resumed, not-found, forbidden, transitioning, limit, timeout, gone, failed). */
  readonly resumes: Counter<"outcome">;
  /** Connections opened to a sandbox's envd before its first request (prewarm.ts), by outcome (opened, failed, skipped). */
  readonly prewarms: Counter<"outcome">;

  constructor(options: { defaultMetrics?: boolean } = {}) {
    this.registry = new Registry();
    const registers = [this.registry];
    this.requests = new Counter({
      name: "warren_proxy_requests_total",
      help: "Requests answered, by kind and status code",
      labelNames: ["kind", "status"],
      registers,
    });
    this.latency = new Histogram({
      name: "warren_proxy_request_duration_seconds",
      help: "Time from request arrival to response headers (or WebSocket switch)",
      labelNames: ["kind"],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.upstreamErrors = new Counter({
      name: "warren_proxy_upstream_errors_total",
      help: "Failures talking to a sandbox, by reason",
      labelNames: ["reason"],
      registers,
    });
    this.routeLookups = new Counter({
      name: "warren_proxy_route_lookups_total",
      help: "Route lookups, by result: hit (in-process cache) or miss (Redis)",
      labelNames: ["result"],
      registers,
    });
    this.routeErrors = new Counter({
      name: "warren_proxy_route_errors_total",
      help: "Route lookups that failed",
      registers,
    });
    this.openWebSockets = new Gauge({
      name: "warren_proxy_open_websockets",
      help: "WebSocket (and other upgraded) connections currently open",
      registers,
    });
    this.inFlightRequests = new Gauge({
      name: "warren_proxy_in_flight_requests",
      help: "HTTP requests currently being forwarded",
      registers,
    });
    this.resumes = new Counter({
      name: "warren_proxy_auto_resumes_total",
      help: "Auto-resumes triggered by traffic, by outcome",
      labelNames: ["outcome"],
      registers,
    });
    this.prewarms = new Counter({
      name: "warren_proxy_envd_prewarms_total",
      help: "Kept-alive connections opened to a new sandbox's envd ahead of its first request, by outcome",
      labelNames: ["outcome"],
      registers,
    });
    if (options.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry, prefix: "warren_proxy_" });
  }
}
