#!/usr/bin/env node
import cluster, { type Worker } from "node:cluster";
import type { Server } from "node:http";
import { availableParallelism } from "node:os";
import { AggregatorRegistry } from "prom-client";
import { type RunningProxy, startMetricsServer, startProxy } from "./app.js";
import { ConfigError, loadConfig, type ProxyConfig } from "./config.js";
import { type ControlPlaneResumer, resumerFromEnv } from "./control-plane-resumer.js";
import { execDeciderFromEnv } from "./exec-gate.js";
import { createLogger, type Logger } from "./log.js";
import { ProxyMetrics } from "./metrics.js";
import { grantRedeemerFromEnv } from "./secret-grants.js";

const log = createLogger("proxy");

/**
 * One process, or with PROXY_WORKERS > 1 a primary that forks workers sharing the listen port
 * (node:cluster) and serves their summed metrics. SIGTERM/SIGINT drain gracefully.
 */
async function main(): Promise<void> {
  const config = loadConfig(process.env, availableParallelism());
  if (config.workers > 1 && cluster.isPrimary) return runPrimary(config);
  return runWorker(config, cluster.isWorker);
}

async function runWorker(config: ProxyConfig, isClusterWorker: boolean): Promise<void> {
  // Auto-resume goes through the api (control-plane-resumer.ts) when PROXY_RESUME_URL/PROXY_RESUME_TOKEN are set;
  // without them a paused sandbox answers 502 "The sandbox was not found", as E2B's does without auto-resume.
  let resumer: ControlPlaneResumer | undefined;
  try {
    resumer = resumerFromEnv(process.env);
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
  const metrics = new ProxyMetrics();
  if (isClusterWorker) {
    // Constructing one registers prom-client's listener that answers the primary's metric requests.
    new AggregatorRegistry();
    AggregatorRegistry.setRegistries([metrics.registry]);
  }
  // Secret grants are redeemed at the same api, with the same URL and token.
  const secretGrants = grantRedeemerFromEnv(process.env);
  // So are exec policy decisions (deny records, reviews, approvals); the policies themselves come from Redis.
  const execDecider = execDeciderFromEnv(process.env);
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
  onSignals((signal) => shutdownWorker(running, metricsServer, signal, log));
}

async function shutdownWorker(running: RunningProxy, metricsServer: Server | undefined, signal: string, log: Logger) {
  log.info("draining", { signal, open: running.proxy.openConnections });
  try {
    await running.close();
    metricsServer?.close();
    log.info("stopped");
    process.exit(0);
  } catch (error) {
    log.error("shutdown failed", { error: String(error) });
    process.exit(1);
  }
}

async function runPrimary(config: ProxyConfig): Promise<void> {
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
  onSignals((signal) => {
    stopping = true;
    log.info("stopping workers", { signal });
    const workers = Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined);
    let left = workers.length;
    const done = () => {
      metricsServer?.close();
      process.exit(0);
    };
    if (left === 0) done();
    for (const worker of workers) {
      worker.once("exit", () => {
        left -= 1;
        if (left === 0) done();
      });
      worker.process.kill("SIGTERM");
    }
  });
}

function onSignals(handler: (signal: string) => void): void {
  process.once("SIGTERM", () => handler("SIGTERM"));
  process.once("SIGINT", () => handler("SIGINT"));
}

main().catch((error: unknown) => {
  if (error instanceof ConfigError) {
    process.stderr.write(`warren-proxy: ${error.message}\n`);
    process.exit(2);
  }
  log.error("proxy failed to start", { error: error instanceof Error ? error.message : String(error) });
  process.exit(1);
});
