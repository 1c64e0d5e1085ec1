import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Redis } from "ioredis";
import type { ProxyConfig } from "./config.js";
import { type ExecDecider, ExecGate, RedisPolicySource } from "./exec-gate.js";
import type { Logger } from "./log.js";
import { ProxyMetrics } from "./metrics.js";
import { CachedPolicySource } from "./policy-cache.js";
import type { SandboxResumer } from "./resume.js";
import { RouteStore } from "./routes.js";
import type { SecretGrantRedeemer } from "./secret-grants.js";
import { SandboxProxy } from "./server.js";

export interface RunningProxy {
  readonly proxy: SandboxProxy;
  readonly routes: RouteStore;
  readonly metrics: ProxyMetrics;
  /** Where sandbox traffic is accepted. */
  readonly address: AddressInfo;
  /** Graceful: drains in-flight exchanges (config.drainTimeoutMs), then releases Redis. */
  close(): Promise<void>;
}

export interface StartOptions {
  readonly log: Logger;
  readonly resumer?: SandboxResumer;
  /** Redeems secret grants on envd Start requests; without one such a request fails with failed_precondition. */
  readonly secretGrants?: SecretGrantRedeemer;
  /** With one, teams' exec policies (read from Redis) are enforced on envd starts and file writes. */
  readonly execDecider?: ExecDecider;
  readonly metrics?: ProxyMetrics;
}

/** Connects to Redis, subscribes to route events and starts listening for sandbox traffic. */
export async function startProxy(config: ProxyConfig, options: StartOptions): Promise<RunningProxy> {
  const { log } = options;
  const metrics = options.metrics ?? new ProxyMetrics();
  const redis = new Redis(config.redisUrl, {
    // A lookup fails fast instead of queueing forever while Redis is away; the request gets 502.
    maxRetriesPerRequest: 1,
    commandTimeout: config.redisTimeoutMs,
    // Concurrent misses go out as one pipeline.
    enableAutoPipelining: true,
    connectionName: "warren-proxy",
    // WARREN_REDIS_PREFIX; RouteStore derives the events channel from it.
    keyPrefix: config.redisPrefix,
  });
  const subscriber = new Redis(config.redisUrl, {
    autoResubscribe: true,
    maxRetriesPerRequest: null,
    connectionName: "warren-proxy-events",
  });
  for (const [name, client] of [
    ["routes", redis],
    ["events", subscriber],
  ] as const) {
    client.on("error", (error: Error) =>
      log.warn("redis connection error", { connection: name, error: error.message }),
    );
  }
  const routes = new RouteStore(
    redis,
    subscriber,
    {
      cacheTtlMs: config.routeCacheTtlMs,
      cacheMax: config.routeCacheMax,
      onLookup: (result) => metrics.routeLookups.inc({ result }),
    },
    log,
  );
  const policies = options.execDecider
    ? new CachedPolicySource(
        new RedisPolicySource(redis),
        subscriber,
        config.redisPrefix,
        { ttlMs: config.routeCacheTtlMs, maxTeams: config.routeCacheMax },
        log,
      )
    : undefined;
  try {
    await routes.start();
    await policies?.start();
  } catch (error) {
    policies?.close();
    await routes.close();
    throw error;
  }
  const proxy = new SandboxProxy({
    config,
    routes,
    metrics,
    log,
    ...(options.resumer ? { resumer: options.resumer } : {}),
    ...(options.secretGrants ? { secretGrants: options.secretGrants } : {}),
    ...(options.execDecider && policies ? { execGate: new ExecGate(policies, options.execDecider) } : {}),
  });
  const address = await proxy.listen();
  log.info("proxy listening", {
    host: address.address,
    port: address.port,
    tls: config.tls !== undefined,
    domains: config.domains,
    routeCacheTtlMs: config.routeCacheTtlMs,
    relay: config.relay,
    nodeId: config.nodeId,
  });
  return {
    proxy,
    routes,
    metrics,
    address,
    async close() {
      await proxy.close();
      policies?.close();
      await routes.close();
    },
  };
}

/** Serves Prometheus text at /metrics (and 200 at /healthz) on its own port. */
export async function startMetricsServer(
  host: string,
  port: number,
  render: () => Promise<{ contentType: string; body: string }>,
  log: Logger,
): Promise<Server> {
  const server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (path === "/healthz") {
      res.writeHead(200, { "Content-Type": "text/plain" }).end("ok\n");
      return;
    }
    if (path !== "/metrics") {
      res.writeHead(404, { "Content-Type": "text/plain" }).end("not found\n");
      return;
    }
    render().then(
      ({ contentType, body }) => res.writeHead(200, { "Content-Type": contentType }).end(body),
      (error: unknown) => {
        log.error("metrics render failed", { error: String(error) });
        res.writeHead(500, { "Content-Type": "text/plain" }).end("metrics unavailable\n");
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const address = server.address() as AddressInfo;
  log.info("metrics listening", { host: address.address, port: address.port });
  return server;
}
