#!/usr/bin/env node
import cluster, { type Worker } from "node:cluster";
import { availableParallelism } from "node:os";
import { runMain, type Stoppable } from "@warren/platform/main";
import { AggregatorRegistry } from "prom-client";
import { startMetricsServer, startProxy } from "./app.js";
import { loadConfig, type ProxyConfig } from "./config.js";
import { ControlPlaneResumer } from "./control-plane-resumer.js";
import { ControlPlaneExecDecider } from "./exec-gate.js";
import { createLogger } from "./log.js";
import { ProxyMetrics } from "./metrics.js";
import { ControlPlaneGrantRedeemer } from "./secret-grants.js";

const log = createLogger("proxy");

/**
 * One process, or with PROXY_WORKERS > 1 a primary that forks workers sharing the listen port
 * (node:cluster) and serves their summed metrics. SIGTERM/SIGINT drain gracefully.
 */
runMain(
  async () => {
    const config = loadConfig(process.env, availableParallelism());
    if (config.workers > 1 && cluster.isPrimary) return startPrimary(config);
    return startWorker(config, cluster.isWorker);
  },
  { name: "warren-proxy", log },
);

async function startWorker(config: ProxyConfig, isClusterWorker: boolean): Promise<Stoppable> {
  // The api's internal routes (PROXY_RESUME_URL, WARREN_INTERNAL_TOKEN): auto-resume, secret grants, and exec policy
  // decisions (deny records, reviews, approvals; the policies themselves come from Redis). Without them a paused
  // sandbox answers 502 "The sandbox was not found", as E2B's does without auto-resume.
  const api = config.internalApi;
  const resumer = api ? new ControlPlaneResumer(api) : undefined;
  const secretGrants = api ? new ControlPlaneGrantRedeemer(api.url, api.token) : undefined;
  const execDecider = api ? new ControlPlaneExecDecider(api.url, api.token) : undefined;
  const metrics = new ProxyMetrics();
  if (isClusterWorker) {
    // Constructing one registers prom-client's listener that answers the primary's metric requests.
    new AggregatorRegistry();
    AggregatorRegistry.setRegistries([metrics.registry]);
  }
  const running = await startProxy(config, {
    log,
    metrics,
    ...(resumer ? { resumer } : {}),
    ...(secretGrants ? { secretGrants } : {}),
    ...(execDecider ? { execDecider } : {}),
  });
  const metricsServer =
    !isClusterWorker && config.metricsPort !== undefined
      ? await startMetricsServer(
          config.metricsHost,
          config.metricsPort,
          async () => ({ contentType: metrics.registry.contentType, body: await metrics.registry.metrics() }),
          log,
        )
      : undefined;
  return {
    stop: async () => {
      log.info("draining", { open: running.proxy.openConnections });
      await running.close();
      metricsServer?.close();
      log.info("stopped");
    },
  };
}

async function startPrimary(config: ProxyConfig): Promise<Stoppable> {
  let stopping = false;
  const fork = (): Worker => {
    const worker = cluster.fork();
    worker.once("exit", (code, signal) => {
      if (stopping) return;
      log.error("worker exited; starting another", { workerPid: worker.process.pid, code, signal });
      setTimeout(fork, 500);
    });
    return worker;
  };
  for (let i = 0; i < config.workers; i++) fork();
  log.info("proxy primary started", { workers: config.workers });
  const aggregator = new AggregatorRegistry();
  const metricsServer =
    config.metricsPort !== undefined
      ? await startMetricsServer(
          config.metricsHost,
          config.metricsPort,
          async () => ({ contentType: aggregator.contentType, body: await aggregator.clusterMetrics() }),
          log,
        )
      : undefined;
  return {
    // Each worker drains its own connections; the primary waits for all of them.
    stop: (signal) => {
      stopping = true;
      const workers = Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined);
      const exited = workers.map((worker) => new Promise<void>((resolve) => worker.once("exit", () => resolve())));
      for (const worker of workers) worker.process.kill(signal);
      return Promise.all(exited).then(() => {
        metricsServer?.close();
      });
    },
  };
}
