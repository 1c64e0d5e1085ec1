import { hostname } from "node:os";
import { ConfigError, DATABASE_URL, integerFromEnv, REDIS_URL, renamedEnv, warnOnStderr } from "@warren/platform/env";
import type { TemplateBuildConfig } from "./templates/template-builder.js";

/**
 * The master's Kubernetes integration (`kubernetes/`): node agents discovered from their pods, Node cordon /
 * NotReady / drain followed, and a coordination.k8s.io Lease instead of the PostgreSQL lock for leader election.
 */
export interface KubernetesConfig {
  /**
   * WARREN_KUBERNETES: `in-cluster` (the pod's service account: KUBERNETES_SERVICE_HOST/PORT and the token and CA
   * under /var/run/secrets/kubernetes.io/serviceaccount) or `kubeconfig` (KUBECONFIG, else ~/.kube/config). `off`
   * (the default) leaves the master as without Kubernetes: Redis heartbeats, PostgreSQL advisory lock.
   */
  readonly mode: "in-cluster" | "kubeconfig";
  /** WARREN_KUBERNETES_NAMESPACE: namespace of the node agent pods and of the Lease (required). */
  readonly namespace: string;
  /** WARREN_KUBERNETES_AGENT_SELECTOR: label selector of the node agent pods (required). */
  readonly agentSelector: string;
  /** WARREN_KUBERNETES_AGENT_PORT: the agents' Connect port, a container port name or number (default connect). */
  readonly agentPort: string | number;
  /** WARREN_KUBERNETES_LEASE: name of the leader Lease (default warren-master). */
  readonly leaseName: string;
  /** WARREN_KUBERNETES_LEASE_SECONDS: leaseDurationSeconds (default 15; at least 3 × the leader interval). */
  readonly leaseSeconds: number;
  /** WARREN_KUBERNETES_IDENTITY: this replica's name in the Lease (default: the host name, i.e. the pod name). */
  readonly identity: string;
  /**
   * WARREN_KUBERNETES_DRAIN_TAINTS: Node taint keys that mean "this node is going away: pause its sandboxes"
   * (comma-separated; default warren.dev/drain,ToBeDeletedByClusterAutoscaler,karpenter.sh/disrupted).
   */
  readonly drainTaints: readonly string[];
}

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
  /** WARREN_METRICS_INTERVAL_MS (default 5000): how often the leader samples every running sandbox. */
  readonly metricsIntervalMs: number;
  /**
   * WARREN_STORE_GC_INTERVAL_MS (default 300000): how often the leader removes from the template store what no
   * live snapshot refers to.
   */
  readonly storeGcIntervalMs: number;
  /**
   * WARREN_STORE_LAYER_GRACE_MS (default 3600000): a layer in the store that no published snapshot lists is
   * removed only this long after its push (a publish pushes its layers before the snapshot that lists them).
   */
  readonly storeLayerGraceMs: number;
  /** WARREN_RECONCILE_INTERVAL_MS (default 5000). */
  readonly reconcileIntervalMs: number;
  /**
   * WARREN_DURABILITY_INTERVAL_MS (default 5000): how often the leader's durability pass looks for paused sandboxes
   * and snapshots to publish to the store; a pause on any master nudges it at once besides.
   */
  readonly durabilityIntervalMs: number;
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
  /** Undefined unless WARREN_KUBERNETES turns the integration on. */
  /** Template builds: WARREN_BUILD_CONCURRENCY per node (2), WARREN_BUILD_TIMEOUT_MS (1 h), WARREN_BUILD_DISK_MB
   * (the build sandbox's writable disk, 8192), WARREN_TEMPLATE_DISK_MB (sandboxes from built templates, 2048). */
  readonly builds: TemplateBuildConfig;
  /** WARREN_CREATE_TEMPLATE_WAIT_MS: how long a create waits for a node still building its template (50 s). */
  readonly templateWaitMs: number;
  readonly kubernetes?: KubernetesConfig;
}

/** Intervals, timeouts, sizes and ratios: a positive number (fractions allowed); unset or empty gives `fallback`. */
function positiveNumber(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value <= 0) throw new ConfigError(`${name} must be a positive number, got '${raw}'`);
  return value;
}

function syncCommit(raw: string | undefined): "on" | "off" {
  if (raw === undefined || raw === "" || raw === "off") return "off";
  if (raw === "on") return "on";
  throw new ConfigError(`WARREN_DB_SYNCHRONOUS_COMMIT must be on or off, got '${raw}'`);
}

const DEFAULT_DRAIN_TAINTS = ["warren.dev/drain", "ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"];
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;

function kubernetes(env: NodeJS.ProcessEnv, leaderIntervalMs: number): KubernetesConfig | undefined {
  const mode = env.WARREN_KUBERNETES || "off";
  if (mode === "off") return undefined;
  if (mode !== "in-cluster" && mode !== "kubeconfig") {
    throw new ConfigError(`WARREN_KUBERNETES must be off, in-cluster or kubeconfig, got '${mode}'`);
  }
  const namespace = env.WARREN_KUBERNETES_NAMESPACE ?? "";
  if (!DNS_LABEL.test(namespace)) {
    throw new ConfigError(`WARREN_KUBERNETES_NAMESPACE must be a namespace name, got '${namespace}'`);
  }
  const agentSelector = (env.WARREN_KUBERNETES_AGENT_SELECTOR ?? "").trim();
  if (!agentSelector)
    throw new ConfigError("WARREN_KUBERNETES_AGENT_SELECTOR must be set (the node agent pods' labels)");
  const rawPort = env.WARREN_KUBERNETES_AGENT_PORT || "connect";
  const agentPort = /^\d+$/.test(rawPort) ? Number(rawPort) : rawPort;
  if (typeof agentPort === "number" && (agentPort < 1 || agentPort > 65535)) {
    throw new ConfigError(`WARREN_KUBERNETES_AGENT_PORT must be a port name or number, got '${rawPort}'`);
  }
  const leaseName = env.WARREN_KUBERNETES_LEASE || "warren-master";
  if (!DNS_SUBDOMAIN.test(leaseName))
    throw new ConfigError(`WARREN_KUBERNETES_LEASE is not a valid name: '${leaseName}'`);
  const leaseSeconds = positiveNumber(env, "WARREN_KUBERNETES_LEASE_SECONDS", 15);
  if (!Number.isInteger(leaseSeconds) || leaseSeconds * 1000 < 3 * leaderIntervalMs) {
    throw new ConfigError(
      `WARREN_KUBERNETES_LEASE_SECONDS must be whole seconds ≥ 3 × WARREN_LEADER_INTERVAL_MS, got ${leaseSeconds}`,
    );
  }
  const drainTaints = (env.WARREN_KUBERNETES_DRAIN_TAINTS ?? DEFAULT_DRAIN_TAINTS.join(","))
    .split(",")
    .map((key) => key.trim())
    .filter(Boolean);
  return {
    mode,
    namespace,
    agentSelector,
    agentPort,
    leaseName,
    leaseSeconds,
    identity: env.WARREN_KUBERNETES_IDENTITY || hostname(),
    drainTaints,
  };
}

export function loadMasterConfig(
  env: NodeJS.ProcessEnv = process.env,
  warn: (message: string) => void = warnOnStderr("master"),
): MasterConfig {
  const tokenSecret = env.WARREN_TOKEN_SECRET ?? "";
  if (tokenSecret.length < 16) throw new ConfigError("WARREN_TOKEN_SECRET must be set (at least 16 characters)");
  const leaderIntervalMs = positiveNumber(env, "WARREN_LEADER_INTERVAL_MS", 2000);
  const kube = kubernetes(env, leaderIntervalMs);
  return {
    // 0 picks a free port (the listening URL is logged).
    port: integerFromEnv(env, "WARREN_MASTER_PORT", 3100, 0, 65535),
    host: env.WARREN_MASTER_HOST || "127.0.0.1",
    databaseUrl: renamedEnv(env, DATABASE_URL, warn) || "postgres://postgres@127.0.0.1:5432/warren",
    schema: env.WARREN_DB_SCHEMA || "warren",
    redisUrl: renamedEnv(env, REDIS_URL, warn) || "redis://127.0.0.1:6379",
    redisKeyPrefix: env.WARREN_REDIS_PREFIX ?? "",
    tokenSecret,
    domain: env.E2B_DOMAIN ?? "",
    evictIntervalMs: positiveNumber(env, "WARREN_EVICT_INTERVAL_MS", 1000),
    metricsIntervalMs: positiveNumber(env, "WARREN_METRICS_INTERVAL_MS", 5000),
    reconcileIntervalMs: positiveNumber(env, "WARREN_RECONCILE_INTERVAL_MS", 5000),
    durabilityIntervalMs: positiveNumber(env, "WARREN_DURABILITY_INTERVAL_MS", 5000),
    storeGcIntervalMs: positiveNumber(env, "WARREN_STORE_GC_INTERVAL_MS", 300_000),
    storeLayerGraceMs: positiveNumber(env, "WARREN_STORE_LAYER_GRACE_MS", 3_600_000),
    leaderIntervalMs,
    synchronousCommit: syncCommit(env.WARREN_DB_SYNCHRONOUS_COMMIT),
    startTimeoutMs: positiveNumber(env, "WARREN_START_TIMEOUT_MS", 120_000),
    nodeDownAfterMs: positiveNumber(env, "WARREN_NODE_DOWN_AFTER_MS", 30_000),
    placementAttempts: positiveNumber(env, "WARREN_PLACEMENT_ATTEMPTS", 3),
    memoryOvercommit: positiveNumber(env, "WARREN_MEMORY_OVERCOMMIT", 4),
    templateWaitMs: positiveNumber(env, "WARREN_CREATE_TEMPLATE_WAIT_MS", 50_000),
    builds: {
      maxConcurrentPerNode: positiveNumber(env, "WARREN_BUILD_CONCURRENCY", 2),
      timeoutMs: positiveNumber(env, "WARREN_BUILD_TIMEOUT_MS", 3_600_000),
      diskMB: positiveNumber(env, "WARREN_BUILD_DISK_MB", 8192),
      sandboxDiskMB: positiveNumber(env, "WARREN_TEMPLATE_DISK_MB", 2048),
    },
    ...(kube ? { kubernetes: kube } : {}),
  };
}
