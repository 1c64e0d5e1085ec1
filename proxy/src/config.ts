import { isIP } from "node:net";
import { hostname as osHostname } from "node:os";
import {
  booleanFromEnv as boolean,
  ConfigError,
  type Env,
  INTERNAL_TOKEN,
  integerFromEnv as integer,
  REDIS_URL,
  renamedEnv,
  warnOnStderr,
} from "@warren/platform/env";
import { ENVD_PORT } from "@warren/proto/ports";
import { parseRedisPrefix } from "@warren/proto/redis";

/**
 * Everything the proxy reads from its environment, parsed and validated once at start.
 * README.md lists every variable with its default; this is the only place that reads them.
 */
export interface ProxyConfig {
  /** PROXY_HOST (0.0.0.0): listen address for sandbox traffic. */
  readonly host: string;
  /** PROXY_PORT (3002): listen port for sandbox traffic; 0 picks a free port. */
  readonly port: number;
  /**
   * PROXY_DOMAINS (empty): comma-separated sandbox domains. A Host `<port>-<id>.<rest>` routes only
   * when `<rest>` is one of them; empty accepts any `<rest>`, as E2B's proxy does.
   */
  readonly domains: readonly string[];
  /**
   * PROXY_SHARED_HOSTS (empty): extra host names on which the E2b-Sandbox-Id/-Port headers route.
   * `localhost`, any IP literal and `sandbox.<anything>` always do (E2B's rule).
   */
  readonly sharedHosts: readonly string[];
  /** PROXY_REDIS_URL (redis://127.0.0.1:6379): where node agents publish routes. */
  readonly redisUrl: string;
  /** WARREN_REDIS_PREFIX (empty): prefix of every Redis key and channel; the same in the whole deployment. */
  readonly redisPrefix: string;
  /** PROXY_ROUTE_CACHE_TTL_MS (5000): upper bound on a cached route's age; 0 disables the cache. */
  readonly routeCacheTtlMs: number;
  /** PROXY_ROUTE_CACHE_MAX (10000): cached routes kept at most. */
  readonly routeCacheMax: number;
  /** PROXY_REDIS_TIMEOUT_MS (2000): a route lookup slower than this fails (502). */
  readonly redisTimeoutMs: number;
  /** PROXY_ENVD_PORT (49983): the port whose control-only paths are refused and that skips the traffic token. */
  readonly envdPort: number;
  /** PROXY_MAX_CONNECTIONS_PER_SANDBOX (1000): concurrent requests + WebSockets per sandbox; 0 = unlimited. */
  readonly maxConnectionsPerSandbox: number;
  /** PROXY_UPSTREAM_CONNECT_RETRIES (3): extra connect attempts when the sandbox port refuses. */
  readonly upstreamConnectRetries: number;
  /** PROXY_UPSTREAM_CONNECT_TIMEOUT_MS (5000): one connect attempt's limit. */
  readonly upstreamConnectTimeoutMs: number;
  /** PROXY_UPSTREAM_MAX_IDLE_PER_HOST (256): idle keep-alive connections kept per sandbox port. */
  readonly upstreamMaxIdlePerHost: number;
  /**
   * PROXY_PREWARM_ENVD (true): when a sandbox's route turns `running`, this proxy reads the route and opens a
   * kept-alive connection to its envd (`GET /health`), so the first command after a create or resume finds both
   * ready. Only for sandboxes it reaches directly (not through a relay), and only with keep-alive on.
   */
  readonly prewarmEnvd: boolean;
  /** PROXY_IDLE_TIMEOUT_MS (610000): a connection with no traffic either way for this long is closed. */
  readonly idleTimeoutMs: number;
  /** PROXY_RESUME_TIMEOUT_MS (60000): how long a request waits for an auto-resume before 409. */
  readonly resumeTimeoutMs: number;
  /** PROXY_DRAIN_TIMEOUT_MS (30000): on SIGTERM, how long in-flight requests and streams may finish. */
  readonly drainTimeoutMs: number;
  /** PROXY_METRICS_HOST (0.0.0.0) / PROXY_METRICS_PORT (9464, "off" disables): Prometheus /metrics. */
  readonly metricsHost: string;
  readonly metricsPort: number | undefined;
  /**
   * PROXY_API_URL (unset): the api's base URL (http://host:port). When set, requests for `api.<domain>` (a domain
   * of PROXY_DOMAINS; any when that is empty) are forwarded to it, so E2B's layout (`api.<domain>` next to
   * `<port>-<id>.<domain>`) is served by one listener with one wildcard certificate, as the chart's Ingress does.
   */
  readonly apiUpstream: { readonly host: string; readonly port: number } | undefined;
  /**
   * PROXY_RESUME_URL (the api's base URL) and WARREN_INTERNAL_TOKEN (the api's, ≥ 16 characters; PROXY_RESUME_TOKEN
   * before), both or neither: the api's internal routes, for auto-resume, secret grants and exec decisions. Neither:
   * no auto-resume (paused sandboxes answer 502), no secret grants, no exec policies enforced with approvals.
   */
  readonly internalApi: { readonly url: string; readonly token: string } | undefined;
  /** PROXY_TLS_CERT_FILE / PROXY_TLS_KEY_FILE (unset): PEM files (a wildcard cert for `*.<domain>`); both or neither. */
  readonly tls: { readonly certFile: string; readonly keyFile: string } | undefined;
  /** PROXY_WORKERS (1): processes sharing the listen port (node:cluster); "auto" = one per CPU. */
  readonly workers: number;
  /** PROXY_ACCESS_LOG (false): one log line per request (ids, status, timing; never headers). */
  readonly accessLog: boolean;
  /**
   * PROXY_RELAY (off): how upstream connections reach sandboxes. `off`: straight to `sandboxAddr:port` (the proxy
   * must be on the sandbox's node). `always`: through the node agent's relay at `route.nodeAddr`
   * (`CONNECT sandboxAddr:port`). `auto`: directly when `route.node` is this proxy's node (PROXY_NODE_ID), else
   * through the relay.
   */
  readonly relay: RelayMode;
  /** PROXY_RELAY_TOKEN: the node agents' WARREN_RELAY_TOKEN; required unless PROXY_RELAY is off. */
  readonly relayToken: string | undefined;
  /**
   * PROXY_NODE_ID (the host name, normalised as the node agent's default WARREN_NODE_ID): the node this proxy runs
   * on, for PROXY_RELAY=auto. A proxy in the node's network namespace next to an agent with the default id matches.
   */
  readonly nodeId: string;
}

export type RelayMode = "off" | "always" | "auto";

export { ConfigError };

export function loadConfig(
  env: Env,
  cpuCount = 1,
  warn: (message: string) => void = warnOnStderr("proxy"),
): ProxyConfig {
  const certFile = env.PROXY_TLS_CERT_FILE || undefined;
  const keyFile = env.PROXY_TLS_KEY_FILE || undefined;
  if (Boolean(certFile) !== Boolean(keyFile)) {
    throw new ConfigError("PROXY_TLS_CERT_FILE and PROXY_TLS_KEY_FILE must be set together");
  }
  const metricsPortText = env.PROXY_METRICS_PORT ?? "9464";
  const relay = relayMode(env.PROXY_RELAY);
  const relayToken = env.PROXY_RELAY_TOKEN || undefined;
  if (relay !== "off" && !relayToken) throw new ConfigError(`PROXY_RELAY=${relay} needs PROXY_RELAY_TOKEN`);
  if (relayToken !== undefined && relayToken.length < 16) {
    throw new ConfigError("PROXY_RELAY_TOKEN must be at least 16 characters");
  }
  const workersText = env.PROXY_WORKERS ?? "1";
  return {
    host: env.PROXY_HOST || "0.0.0.0",
    port: integer(env, "PROXY_PORT", 3002, 0, 65535),
    domains: list(env.PROXY_DOMAINS).map((domain) => hostname("PROXY_DOMAINS", domain)),
    sharedHosts: list(env.PROXY_SHARED_HOSTS).map((host) => hostname("PROXY_SHARED_HOSTS", host)),
    redisUrl: renamedEnv(env, REDIS_URL, warn) || "redis://127.0.0.1:6379",
    redisPrefix: redisPrefix(env.WARREN_REDIS_PREFIX),
    routeCacheTtlMs: integer(env, "PROXY_ROUTE_CACHE_TTL_MS", 5000, 0, 3_600_000),
    routeCacheMax: integer(env, "PROXY_ROUTE_CACHE_MAX", 10_000, 1, 10_000_000),
    redisTimeoutMs: integer(env, "PROXY_REDIS_TIMEOUT_MS", 2000, 1, 60_000),
    envdPort: integer(env, "PROXY_ENVD_PORT", ENVD_PORT, 1, 65535),
    maxConnectionsPerSandbox: integer(env, "PROXY_MAX_CONNECTIONS_PER_SANDBOX", 1000, 0, 10_000_000),
    upstreamConnectRetries: integer(env, "PROXY_UPSTREAM_CONNECT_RETRIES", 3, 0, 100),
    upstreamConnectTimeoutMs: integer(env, "PROXY_UPSTREAM_CONNECT_TIMEOUT_MS", 5000, 1, 600_000),
    upstreamMaxIdlePerHost: integer(env, "PROXY_UPSTREAM_MAX_IDLE_PER_HOST", 256, 0, 100_000),
    prewarmEnvd: boolean(env, "PROXY_PREWARM_ENVD", true),
    idleTimeoutMs: integer(env, "PROXY_IDLE_TIMEOUT_MS", 610_000, 1000, 86_400_000),
    resumeTimeoutMs: integer(env, "PROXY_RESUME_TIMEOUT_MS", 60_000, 1, 3_600_000),
    drainTimeoutMs: integer(env, "PROXY_DRAIN_TIMEOUT_MS", 30_000, 0, 3_600_000),
    metricsHost: env.PROXY_METRICS_HOST || "0.0.0.0",
    metricsPort:
      metricsPortText === "off"
        ? undefined
        : integer({ PROXY_METRICS_PORT: metricsPortText }, "PROXY_METRICS_PORT", 0, 0, 65535),
    apiUpstream: apiUpstream(env.PROXY_API_URL),
    internalApi: internalApi(env.PROXY_RESUME_URL, renamedEnv(env, INTERNAL_TOKEN, warn)),
    tls: certFile && keyFile ? { certFile, keyFile } : undefined,
    workers: workersText === "auto" ? Math.max(1, cpuCount) : integer(env, "PROXY_WORKERS", 1, 1, 256),
    accessLog: boolean(env, "PROXY_ACCESS_LOG", false),
    relay,
    relayToken: relay === "off" ? undefined : relayToken,
    nodeId: env.PROXY_NODE_ID || defaultNodeId(),
  };
}

function relayMode(text: string | undefined): RelayMode {
  const mode = text || "off";
  if (mode !== "off" && mode !== "always" && mode !== "auto") {
    throw new ConfigError(`PROXY_RELAY must be off, always or auto, got '${mode}'`);
  }
  return mode;
}

/** The node agent's default WARREN_NODE_ID rule (control-plane/src/node-agent/config.ts), applied to this host. */
function defaultNodeId(): string {
  return osHostname()
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, "-")
    .slice(0, 63);
}

function internalApi(url = "", token = ""): ProxyConfig["internalApi"] {
  if (!url && !token) return undefined;
  if (!url || !token) throw new ConfigError("PROXY_RESUME_URL and WARREN_INTERNAL_TOKEN must be set together");
  if (token.length < 16) throw new ConfigError("WARREN_INTERNAL_TOKEN must be at least 16 characters");
  try {
    new URL(url);
  } catch {
    throw new ConfigError(`PROXY_RESUME_URL is not a URL: '${url}'`);
  }
  return { url, token };
}

function apiUpstream(text: string | undefined): ProxyConfig["apiUpstream"] {
  if (!text) return undefined;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new ConfigError(`PROXY_API_URL must be a URL, got '${text}'`);
  }
  if (url.protocol !== "http:" || url.pathname !== "/" || url.search || url.username) {
    throw new ConfigError(`PROXY_API_URL must be http://host[:port] with no path, got '${text}'`);
  }
  const host = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
  return { host, port: url.port ? Number(url.port) : 80 };
}

function redisPrefix(text: string | undefined): string {
  try {
    return parseRedisPrefix(text);
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
}

function list(text: string | undefined): string[] {
  return (text ?? "")
    .split(",")
    .map((item) => item.trim().toLowerCase())
    .filter((item) => item !== "");
}

const HOSTNAME = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/;

function hostname(name: string, value: string): string {
  if (!HOSTNAME.test(value) && isIP(value) === 0) throw new ConfigError(`${name}: '${value}' is not a host name`);
  return value;
}
