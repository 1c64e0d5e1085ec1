/** The master's one configuration object, from environment variables (documented defaults). */
export interface MasterConfig {
  /** WARREN_MASTER_PORT (default 3100). */
  readonly port: number;
  /** WARREN_MASTER_HOST (default 127.0.0.1). */
  readonly host: string;
  /** DATABASE_URL (default postgres://postgres@127.0.0.1:5432/warren). */
  readonly databaseUrl: string;
  /** WARREN_DB_SCHEMA (default warren). */
  readonly schema: string;
  /** REDIS_URL (default redis://127.0.0.1:6379). */
  readonly redisUrl: string;
  /** WARREN_REDIS_PREFIX: prefix of every Redis key (default empty; node agents and proxies must agree). */
  readonly redisKeyPrefix: string;
  /** WARREN_TOKEN_SECRET: derives sandbox tokens; required, ≥ 16 characters, same on every master. */
  readonly tokenSecret: string;
  /** E2B_DOMAIN: data-plane domain handed to clients (default empty: clients use their own). */
  readonly domain: string;
  /** WARREN_EVICT_INTERVAL_MS (default 1000). */
  readonly evictIntervalMs: number;
  /** WARREN_RECONCILE_INTERVAL_MS (default 5000). */
  readonly reconcileIntervalMs: number;
  /** WARREN_LEADER_INTERVAL_MS (default 2000). */
  readonly leaderIntervalMs: number;
  /** WARREN_DB_SYNCHRONOUS_COMMIT: on | off (default off; see store/db.ts). */
  readonly synchronousCommit: "on" | "off";
  /** WARREN_START_TIMEOUT_MS: a sandbox still `starting` after this is failed by the reconciler (default 120000). */
  readonly startTimeoutMs: number;
  /** WARREN_NODE_DOWN_AFTER_MS: heartbeat missing this long ⇒ node down, its sandboxes lost (default 30000). */
  readonly nodeDownAfterMs: number;
  /** WARREN_PLACEMENT_ATTEMPTS (default 3). */
  readonly placementAttempts: number;
  /** WARREN_MEMORY_OVERCOMMIT (default 4). */
  readonly memoryOvercommit: number;
}

function int(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number, got '${raw}'`);
  return value;
}

/** A TCP port; 0 picks a free one (the listening URL is logged). */
function port(raw: string | undefined, fallback: number): number {
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 0 || value > 65535) {
    throw new Error(`WARREN_MASTER_PORT must be a port number, got '${raw}'`);
  }
  return value;
}

function syncCommit(raw: string | undefined): "on" | "off" {
  if (raw === undefined || raw === "" || raw === "off") return "off";
  if (raw === "on") return "on";
  throw new Error(`WARREN_DB_SYNCHRONOUS_COMMIT must be on or off, got '${raw}'`);
}

export function loadMasterConfig(env: NodeJS.ProcessEnv = process.env): MasterConfig {
  const tokenSecret = env.WARREN_TOKEN_SECRET ?? "";
  if (tokenSecret.length < 16) throw new Error("WARREN_TOKEN_SECRET must be set (at least 16 characters)");
  return {
    port: port(env.WARREN_MASTER_PORT, 3100),
    host: env.WARREN_MASTER_HOST || "127.0.0.1",
    databaseUrl: env.DATABASE_URL || "postgres://postgres@127.0.0.1:5432/warren",
    schema: env.WARREN_DB_SCHEMA || "warren",
    redisUrl: env.REDIS_URL || "redis://127.0.0.1:6379",
    redisKeyPrefix: env.WARREN_REDIS_PREFIX ?? "",
    tokenSecret,
    domain: env.E2B_DOMAIN ?? "",
    evictIntervalMs: int(env, "WARREN_EVICT_INTERVAL_MS", 1000),
    reconcileIntervalMs: int(env, "WARREN_RECONCILE_INTERVAL_MS", 5000),
    leaderIntervalMs: int(env, "WARREN_LEADER_INTERVAL_MS", 2000),
    synchronousCommit: syncCommit(env.WARREN_DB_SYNCHRONOUS_COMMIT),
    startTimeoutMs: int(env, "WARREN_START_TIMEOUT_MS", 120_000),
    nodeDownAfterMs: int(env, "WARREN_NODE_DOWN_AFTER_MS", 30_000),
    placementAttempts: int(env, "WARREN_PLACEMENT_ATTEMPTS", 3),
    memoryOvercommit: int(env, "WARREN_MEMORY_OVERCOMMIT", 4),
  };
}
