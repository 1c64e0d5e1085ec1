import type { Interceptor } from "@connectrpc/connect";
import { ConnectError } from "@connectrpc/connect";
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { Db } from "../store/db.js";
import type { Logger } from "./log.js";

/** Prometheus metrics of one master replica (served at /metrics next to the Connect service). */
export class MasterMetrics {
  readonly registry = new Registry();
  readonly rpcs = new Counter({
    name: "warren_master_rpcs_total",
    help: "MasterService calls, by method and Connect code",
    labelNames: ["method", "code"] as const,
    registers: [this.registry],
  });
  readonly rpcDuration = new Histogram({
    name: "warren_master_rpc_duration_seconds",
    help: "MasterService call duration, by method",
    labelNames: ["method"] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });

  constructor(db: Db, isLeader: () => boolean) {
    collectDefaultMetrics({ register: this.registry, prefix: "warren_master_" });
    new Gauge({
      name: "warren_master_leader",
      help: "1 while this replica holds the leader lock",
      registers: [this.registry],
      collect() {
        this.set(isLeader() ? 1 : 0);
      },
    });
    new Gauge({
      name: "warren_sandboxes",
      help: "Sandboxes not yet ended, by state (from PostgreSQL)",
      labelNames: ["state"] as const,
      registers: [this.registry],
      async collect() {
        this.reset();
        const result = await db.query<{ state: string; n: string }>(
          "SELECT state, count(*) AS n FROM sandboxes WHERE state NOT IN ('killed','failed') GROUP BY state",
        );
        for (const row of result.rows) this.set({ state: row.state }, Number(row.n));
      },
    });
  }

  /** Counts, times and logs every RPC (sandbox id and team, never tokens or env vars). */
  interceptor(log: Logger): Interceptor {
    return (next) => async (req) => {
      const started = process.hrtime.bigint();
      const method = req.method.name;
      const message = req.message as { sandboxId?: string; teamId?: string };
      let code = "ok";
      try {
        return await next(req);
      } catch (error) {
        code = ConnectError.from(error).code.toString();
        throw error;
      } finally {
        const seconds = Number(process.hrtime.bigint() - started) / 1e9;
        this.rpcs.inc({ method, code });
        this.rpcDuration.observe({ method }, seconds);
        log.info("rpc", {
          method,
          code,
          sandboxId: message.sandboxId,
          team: message.teamId,
          ms: Math.round(seconds * 1000),
        });
      }
    };
  }
}
