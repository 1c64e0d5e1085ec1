import { Counter, collectDefaultMetrics, Histogram, Registry } from "prom-client";

/** Prometheus metrics of one api process, in its own registry (tests run several). */
export class ApiMetrics {
  readonly registry = new Registry();
  readonly requests = new Counter({
    name: "warren_api_requests_total",
    help: "HTTP requests answered, by route and status",
    labelNames: ["method", "route", "status"] as const,
    registers: [this.registry],
  });
  readonly duration = new Histogram({
    name: "warren_api_request_duration_seconds",
    help: "HTTP request duration, by route",
    labelNames: ["method", "route"] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [this.registry],
  });
  readonly sandboxCreates = new Counter({
    name: "warren_api_sandbox_creates_total",
    help: "Sandbox create requests, by outcome",
    labelNames: ["outcome"] as const,
    registers: [this.registry],
  });

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: "warren_api_" });
  }
}
