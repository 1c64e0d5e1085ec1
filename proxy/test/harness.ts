import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, request, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import {
  DELETE_ROUTE_SCRIPT,
  type RouteEvent,
  routeEventsChannel,
  routeKey,
  routeToHash,
  type SandboxRoute,
  WRITE_ROUTE_SCRIPT,
} from "@warren/proto/redis";
import { Redis } from "ioredis";
import { type RunningProxy, startProxy } from "../src/app.js";
import { loadConfig } from "../src/config.js";
import { createLogger } from "../src/log.js";
import { ProxyMetrics } from "../src/metrics.js";
import type { SandboxResumer } from "../src/resume.js";
import type { SecretGrantRedeemer } from "../src/secret-grants.js";

export const REDIS_URL = "redis://127.0.0.1:6379";

/** `i` + 20 lowercase alphanumerics, like E2B's sandbox ids; unique per test so tests share one Redis. */
export function randomSandboxId(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  const bytes = randomBytes(20);
  let id = "i";
  for (const byte of bytes) id += alphabet[byte % alphabet.length];
  return id;
}

export interface TestProxy {
  readonly running: RunningProxy;
  readonly port: number;
  readonly url: string;
  /** Everything the proxy logged so far (tests check no token appears in it). */
  logs(): string;
  close(): Promise<void>;
}

/** The proxy in this process on a random loopback port, configured from env-style overrides. */
export async function startTestProxy(
  env: Record<string, string> = {},
  options: { resumer?: SandboxResumer; secretGrants?: SecretGrantRedeemer } = {},
): Promise<TestProxy> {
  const config = loadConfig({
    PROXY_HOST: "127.0.0.1",
    PROXY_PORT: "0",
    PROXY_METRICS_PORT: "off",
    WARREN_REDIS_URL: REDIS_URL,
    PROXY_UPSTREAM_CONNECT_RETRIES: "1",
    PROXY_DRAIN_TIMEOUT_MS: "5000",
    // Off unless a test is about it: its GET /health would reach stand-ins that record what they are sent.
    PROXY_PREWARM_ENVD: "false",
    ...env,
  });
  let logs = "";
  const log = createLogger("proxy", {
    write: (line) => {
      logs += line;
    },
  });
  const running = await startProxy(config, {
    log,
    metrics: new ProxyMetrics({ defaultMetrics: false }),
    ...(options.resumer ? { resumer: options.resumer } : {}),
    ...(options.secretGrants ? { secretGrants: options.secretGrants } : {}),
  });
  const port = running.address.port;
  let closed = false;
  return {
    running,
    port,
    url: `http://127.0.0.1:${port}`,
    logs: () => logs,
    async close() {
      if (closed) return;
      closed = true;
      await running.close();
    },
  };
}

/**
 * Writes and deletes routes the way a node agent does (the contract's compare-and-set scripts), under a
 * WARREN_REDIS_PREFIX when given.
 */
export class RouteWriter {
  readonly redis: Redis;
  private readonly channel: string;
  private readonly written = new Set<string>();

  constructor(prefix = "") {
    this.redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 1, keyPrefix: prefix });
    this.channel = routeEventsChannel(prefix);
  }

  async write(route: Partial<SandboxRoute> & Pick<SandboxRoute, "sandboxId" | "sandboxAddr">): Promise<SandboxRoute> {
    const full: SandboxRoute = {
      exec: randomBytes(6).toString("hex"),
      generation: 1,
      node: "test-node",
      nodeAddr: "127.0.0.1:1",
      ports: {},
      state: "running",
      team: "test-team",
      public: true,
      trafficTokenHash: "",
      autoResume: false,
      maskRequestHost: "",
      ...route,
    };
    const event: RouteEvent = {
      sandboxId: full.sandboxId,
      exec: full.exec,
      generation: full.generation,
      state: full.state,
    };
    const fields = Object.entries(routeToHash(full)).flat();
    this.written.add(full.sandboxId);
    const written = await this.redis.eval(
      WRITE_ROUTE_SCRIPT,
      1,
      routeKey(full.sandboxId),
      this.channel,
      String(full.generation),
      JSON.stringify(event),
      ...fields,
    );
    if (written !== 1) throw new Error(`route for ${full.sandboxId} generation ${full.generation} was stale`);
    return full;
  }

  /** Deletes the route of incarnation `exec` (as a kill does) and publishes the event. */
  async delete(sandboxId: string, exec: string): Promise<void> {
    const event: RouteEvent = { sandboxId, exec, generation: 0, state: "deleted" };
    await this.redis.eval(DELETE_ROUTE_SCRIPT, 1, routeKey(sandboxId), this.channel, exec, JSON.stringify(event));
  }

  async cleanup(): Promise<void> {
    if (this.written.size > 0) await this.redis.del(...[...this.written].map(routeKey));
    this.written.clear();
    await this.redis.quit();
  }
}

/** Resolves with the first route event the proxy sees that matches (after its cache dropped the route). */
export function nextRouteEvent(proxy: TestProxy, match: (event: RouteEvent) => boolean): Promise<RouteEvent> {
  return new Promise((resolve) => {
    const off = proxy.running.routes.onEvent((event) => {
      if (!match(event)) return;
      off();
      resolve(event);
    });
  });
}

export interface Upstream {
  readonly server: Server;
  readonly port: number;
  /** Connections the server accepted so far. */
  connections(): number;
  close(): Promise<void>;
}

/** A plain HTTP server on a random loopback port, standing in for a sandbox port. */
export async function startUpstream(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  setup?: (server: Server) => void,
): Promise<Upstream> {
  const server = createServer(handler);
  let connections = 0;
  server.on("connection", () => {
    connections += 1;
  });
  setup?.(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    server,
    port: (server.address() as AddressInfo).port,
    connections: () => connections,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A loopback port nothing listens on. */
export async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export interface Reply {
  readonly status: number;
  readonly headers: IncomingMessage["headers"];
  readonly body: string;
}

/** One request to the proxy with an arbitrary Host header (fetch cannot set Host). */
export function send(
  port: number,
  options: { host?: string; path?: string; method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { ...options.headers };
    if (options.host !== undefined) headers.Host = options.host;
    const req = request(
      { host: "127.0.0.1", port, method: options.method ?? "GET", path: options.path ?? "/", headers, agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }),
        );
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(options.body);
  });
}

/** Resolves when `emitter`-style condition holds; used instead of sleeps. */
export function waitUntil(condition: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const tick = () => {
      if (condition()) return resolve();
      if (Date.now() - started > timeoutMs) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, 5);
    };
    tick();
  });
}

/** How many envd prewarms the proxy finished (of one outcome, or all), from its metrics. */
export async function prewarmsDone(proxy: TestProxy, outcome?: "opened" | "skipped" | "failed"): Promise<number> {
  const { values } = await proxy.running.metrics.prewarms.get();
  return values
    .filter((v) => outcome === undefined || v.labels.outcome === outcome)
    .reduce((sum, v) => sum + v.value, 0);
}

/** Waits until the proxy finished `count` envd prewarms in all (route events it reacted to). */
export async function waitForPrewarms(proxy: TestProxy, count: number, timeoutMs = 10_000): Promise<void> {
  const started = Date.now();
  while ((await prewarmsDone(proxy)) < count) {
    if (Date.now() - started > timeoutMs) throw new Error(`timed out waiting for ${count} envd prewarms`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
