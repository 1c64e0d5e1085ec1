import { existsSync } from "node:fs";
import { cpus, hostname } from "node:os";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ConfigError, integerFromEnv as integer, parseList } from "@warren/platform/env";
import { isLogLevel, type LogLevel } from "@warren/platform/log";
import { isNodeId, parseRedisPrefix } from "@warren/proto/redis";
import { DRIVER_REQUESTS, type DriverRequest } from "../runtime/microvm/probe.js";
import { parseStoreUrl } from "./oci-store.js";
import type { SnapshotStoreConfig } from "./snapshot-store.js";

/**
 * The node agent's one configuration object, read once from the environment at start and validated.
 *
 * | variable | default | meaning |
 * |---|---|---|
 * | WARREN_NODE_ID | host name | node id in Redis (lowercase letters, digits, '-') |
 * | WARREN_AGENT_LISTEN | 127.0.0.1:49700 | Connect service address (host:port) |
 * | WARREN_NODE_ADDR | the listen address | address the master and proxies use to reach this agent |
 * | WARREN_REDIS_URL | redis://127.0.0.1:6379 | routes and heartbeats |
 * | WARREN_REDIS_PREFIX | empty | prefix of every Redis key and channel (@warren/proto/redis); same in the whole deployment |
 * | WARREN_STATE_DIR | /var/lib/warren/agent-<instance> | sandbox records, mounts, crun state |
 * | WARREN_TEMPLATES_DIR | /var/lib/warren/templates | template cache, shared by agents on the host |
 * | WARREN_VOLUMES_DIR | /var/lib/warren/volumes | team volumes, `<dir>/<team>/<volume id>`: the same filesystem as the api's and every other node's (NFS or another shared filesystem with several nodes) |
 * | WARREN_INSTANCE | a | tag in netns/veth/cgroup/firewall names ([a-z0-9]{1,4}); one per agent on a host (claimed at start: a second agent under a name in use is refused) |
 * | WARREN_NET_CIDR | 10.201.0.0/16 | sandbox addresses, one /30 each |
 * | WARREN_POOL_SIZE | 2 | warm sandboxes kept per pooled template at least (the floor; demand grows a pool, pool-sizing.ts); 0: no warm pools |
 * | WARREN_POOL_MAX | 32 | warm sandboxes kept per pooled template at most, however high the demand (the ceiling; below WARREN_POOL_SIZE: WARREN_POOL_SIZE) |
 * | WARREN_POOL_WINDOW_MS | 60000 | demand window: a pool holds about as many sandboxes as were claimed from it over the last window |
 * | WARREN_POOL_REFILL | 2 | pool refill starts run at once on the node (all pools together), on start slots no create waits for |
 * | WARREN_POOL_REFILL_DELAY_MS | 200 | a claim's refill waits until this long passes without another claim, while its pool holds more than a quarter of its target (0: at once) |
 * | WARREN_POOL_TEMPLATES | base | templates with a warm pool (comma-separated) |
 * | WARREN_TEMPLATE_POOLS | 4 | custom templates (their ready snapshots) with a warm pool on this node (sized like the others), the most recently used; 0: none |
 * | WARREN_NET_POOL_SIZE | 4 | network namespaces kept ready |
 * | WARREN_PREBUILD_TEMPLATES | base | templates built at start (others are built on first request) |
 * | WARREN_MAX_SANDBOXES | 200 | sandboxes this node accepts |
 * | WARREN_MAX_CONCURRENT_STARTS | 2 × CPUs | cold starts run at once; more creates wait their turn (a burst does not starve every start past its ready deadline) |
 * | WARREN_MAX_QUEUED_STARTS | 256 | creates that may wait for a start slot; past that the node refuses (the master tries another node, then answers 503) |
 * | WARREN_UID_BASE | 100000 | host uid of sandbox root (sandbox uids 0..65535 map to base..base+65535) |
 * | WARREN_NODE_BINARY | the running node | node binary bind-mounted into sandboxes |
 * | WARREN_ENVD_ROOT | this repository | directory with envd/, proto/, node_modules/ |
 * | WARREN_DEBIAN_MIRROR | apt's own | mirror for debootstrap |
 * | WARREN_HEARTBEAT_MS | 5000 | heartbeat period (the node key expires after NODE_TTL_SECONDS) |
 * | WARREN_READY_TIMEOUT_MS | 15000 | how long a start may take before it counts as failed (namespace driver: one still using CPU gets up to 3 times this) |
 * | WARREN_LOG_LEVEL | info | debug, info, warn, error |
 * | WARREN_SANDBOX_LOG_MAX_BYTES | 8388608 | cap on each sandbox's log file on the node (envd.log / the microVM's console.log, which the sandbox itself writes); a larger one is cut to its last half every second |
 * | WARREN_DNS_UPSTREAM | first nameserver of /etc/resolv.conf | DNS server (`ip` or `ip:port`) the egress gateway asks for sandboxes |
 * | WARREN_UPLINK_FORWARDING | 1 | turn on IPv4 forwarding for the default route's interface (replies to sandbox egress); 0: the operator manages it |
 * | WARREN_CRIU | /var/lib/warren/criu/criu when present | CRIU 4 wrapper (scripts/setup-host.sh); "off" or absent: paused sandboxes stay frozen in memory |
 * | WARREN_TOOL_SPAWNER | 1 | host tools (ip, iptables, mount, crun, ...) are forked by envd's `warren-exec --serve` instead of the agent, whose own fork blocks its event loop 6–18 ms a tool; 0: the agent forks them |
 * | WARREN_CHECKPOINT_AFTER_MS | 30000 | a sandbox paused this long is checkpointed to disk (memory released); -1 never |
 * | WARREN_DRIVER | auto | runtime driver: auto (capability probe: microvm only where a guest really boots under KVM, else namespace), namespace, microvm (KVM, fail if it cannot boot), microvm-tcg (software emulation; tests only) |
 * | WARREN_MICROVM_DIR | /var/lib/warren/microvm | microvm driver's cache: guest kernel, root images, template snapshots |
 * | WARREN_MICROVM_KERNEL | <WARREN_MICROVM_DIR>/linux | unpacked Debian cloud kernel package (scripts/setup-host.sh) |
 * | WARREN_MICROVM_BOOT_TIMEOUT_MS | 30000 (KVM), 120000 (TCG) | one cold-boot attempt of a microVM (3 attempts, 4 under TCG; a boot whose guest init has not started after 10 s (KVM) / 45 s (TCG) is retried at once) |
 * | WARREN_MICROVM_RAM_FILE | 1 | template snapshots keep guest RAM in a file that restored VMs map copy-on-write (lazy restore, pages shared by a template's sandboxes); 0: RAM in the migration stream, read whole at every restore (for a state directory on slow or network storage) |
 * | WARREN_KILL_ON_STOP | false | on SIGTERM, kill every sandbox too (a local cluster's `down`), instead of leaving them for re-adoption |
 * | WARREN_STORE | oci:/var/lib/warren/store | where built templates are published for every node (snapshot-store.ts): `oci:<dir>` (a directory: one host, or a filesystem the nodes share) or `docker://<host[:port]>/<path>` (an OCI registry) |
 * | WARREN_STORE_INSECURE | 0 | 1: the registry speaks plain HTTP or has a certificate this node does not trust |
 * | WARREN_STORE_USERNAME, WARREN_STORE_PASSWORD | unset | the registry's credentials (passed to skopeo in a 0600 file, never logged) |
 * | WARREN_SHARE_SHIPPED_TEMPLATES | auto | on: the shipped templates (`base`, `code-interpreter-v1`, …) are made by the master's template builder on one node for the cluster (a claim in Redis) and published to WARREN_STORE, and every other node pulls that copy (digest checked) instead of having its own built, so all nodes run the same bytes (a microvm node, which cannot take a build's layers, waits for that copy); off: each node has its own built; auto: on for a registry store (several nodes), off for a directory (one host, whose agents share WARREN_TEMPLATES_DIR) |
 * | WARREN_PACK_CACHE_MB | 2048 | a registry store's snapshot packs kept on the node (least recently used go first), so a pull fetches only the packs it lacks; 0: off |
 * | WARREN_IMAGE_MIRROR | unset | `host[:port]` pulled from instead of Docker Hub for its image names (templates `fromImage`) |
 * | WARREN_INSECURE_REGISTRIES | unset | comma-separated `host:port` of registries spoken to over plain HTTP |
 * | WARREN_IMAGE_MAX_BYTES | 8589934592 | the largest image a template may start from (compressed layers, and unpacked) |
 * | WARREN_RELAY_TOKEN | unset | shared secret proxies send in `Warren-Relay-Token` to tunnel to this node's sandboxes (`CONNECT <sandboxAddr>:<port>`, relay.ts); unset: the relay is off (405) |
 */
export interface NodeAgentConfig {
  readonly nodeId: string;
  readonly listenHost: string;
  readonly listenPort: number;
  readonly nodeAddr: string;
  readonly redisUrl: string;
  readonly redisPrefix: string;
  readonly stateDir: string;
  readonly templatesDir: string;
  /** WARREN_VOLUMES_DIR: team volumes' folders, `<dir>/<team>/<volume id>` (shared with the api and other nodes). */
  readonly volumesDir: string;
  readonly instance: string;
  readonly netCidr: string;
  readonly poolSize: number;
  /** WARREN_POOL_MAX, WARREN_POOL_WINDOW_MS, WARREN_POOL_REFILL (warm-pool.ts); absent in hand-built test configs. */
  readonly poolMax?: number;
  readonly poolWindowMs?: number;
  readonly poolRefill?: number;
  readonly poolRefillDelayMs?: number;
  readonly poolTemplates: readonly string[];
  /** WARREN_TEMPLATE_POOLS: custom templates kept warm (most recently used). */
  readonly templatePools: number;
  readonly netPoolSize: number;
  readonly prebuildTemplates: readonly string[];
  readonly maxSandboxes: number;
  readonly maxConcurrentStarts: number;
  /** WARREN_MAX_QUEUED_STARTS; absent in hand-built test configs. */
  readonly maxQueuedStarts?: number;
  readonly uidBase: number;
  readonly nodeBinary: string;
  readonly envdRoot: string;
  readonly debianMirror: string | undefined;
  readonly heartbeatMs: number;
  readonly readyTimeoutMs: number;
  readonly sandboxLogMaxBytes: number;
  readonly logLevel: LogLevel;
  readonly killOnStop: boolean;
  readonly criu: string | undefined;
  /** WARREN_TOOL_SPAWNER: host tools are forked by `warren-exec --serve` (runtime/exec.ts), not by the agent. */
  readonly toolSpawner: boolean;
  readonly dnsUpstream: string | undefined;
  readonly uplinkForwarding: boolean;
  /** WARREN_DISK_OVERCOMMIT: how many times its free disk a node may promise to sandbox disks (disk-budget.ts). */
  readonly diskOvercommit: number;
  readonly checkpointAfterMs: number;
  readonly driver: DriverRequest;
  readonly microvmDir: string;
  readonly microvmKernel: string;
  /** 0: the driver's default for its accelerator. */
  readonly microvmBootTimeoutMs: number;
  /** WARREN_MICROVM_RAM_FILE (runtime/microvm/qemu.ts `ramArgs`). */
  readonly microvmRamFile: boolean;
  /** WARREN_RELAY_TOKEN; undefined: the relay is off. */
  readonly relayToken: string | undefined;
  /** WARREN_STORE and its credentials: where built templates are published. */
  readonly store: SnapshotStoreConfig;
  /** WARREN_PACK_CACHE_MB: a registry store's packs kept on the node (pack-cache.ts); 0 off. */
  readonly packCacheMB?: number;
  /** WARREN_SHARE_SHIPPED_TEMPLATES resolved (templates/sharing.ts); absent (tests' hand-made configs): off. */
  readonly shareShippedTemplates?: boolean;
  /** Templates from OCI images: WARREN_IMAGE_MIRROR, WARREN_INSECURE_REGISTRIES, WARREN_IMAGE_MAX_BYTES. */
  readonly images: {
    readonly dockerHubMirror?: string;
    readonly insecureRegistries: readonly string[];
    readonly maxBytes: number;
  };
}

export { ConfigError };

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

function list(env: NodeJS.ProcessEnv, name: string, fallback: string): string[] {
  return parseList(env[name] ?? fallback);
}

const DEFAULT_CRIU = "/var/lib/warren/criu/criu";

/** A positive ratio such as 1 or 2.5 (not 0, not a word), or `fallback` when unset. */
function ratioFromEnv(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const value = env[name];
  if (value === undefined || value === "") return fallback;
  if (!/^\d+(\.\d+)?$/.test(value) || !(Number(value) > 0)) {
    throw new ConfigError(`${name} must be a positive number such as 1 or 2.5, got '${value}'`);
  }
  return Number(value);
}

function criuPath(value: string | undefined): string | undefined {
  if (value === "off") return undefined;
  if (value) {
    if (!existsSync(value)) throw new ConfigError(`WARREN_CRIU '${value}' does not exist`);
    return value;
  }
  return existsSync(DEFAULT_CRIU) ? DEFAULT_CRIU : undefined;
}

function relayToken(value: string | undefined): string | undefined {
  if (!value) return undefined;
  if (value.length < 16) throw new ConfigError("WARREN_RELAY_TOKEN must be at least 16 characters");
  return value;
}

function storeConfig(env: NodeJS.ProcessEnv): SnapshotStoreConfig {
  const url = env.WARREN_STORE || "oci:/var/lib/warren/store";
  try {
    parseStoreUrl(url);
  } catch (error) {
    throw new ConfigError(`WARREN_STORE: ${(error as Error).message}`);
  }
  return {
    url,
    insecure: env.WARREN_STORE_INSECURE === "1",
    ...(env.WARREN_STORE_USERNAME ? { username: env.WARREN_STORE_USERNAME } : {}),
    ...(env.WARREN_STORE_PASSWORD ? { password: env.WARREN_STORE_PASSWORD } : {}),
  };
}

function shareShippedTemplates(value: string | undefined, store: SnapshotStoreConfig): boolean {
  const mode = (value || "auto").toLowerCase();
  if (mode === "on") return true;
  if (mode === "off") return false;
  if (mode === "auto") return parseStoreUrl(store.url).kind === "registry";
  throw new ConfigError(`WARREN_SHARE_SHIPPED_TEMPLATES must be auto, on or off, got '${value}'`);
}

export function loadNodeAgentConfig(env: NodeJS.ProcessEnv = process.env): NodeAgentConfig {
  const nodeId =
    env.WARREN_NODE_ID ??
    hostname()
      .toLowerCase()
      .replace(/[^a-z0-9-]/g, "-")
      .slice(0, 63);
  if (!isNodeId(nodeId)) throw new ConfigError(`WARREN_NODE_ID '${nodeId}' is not a valid id`);
  const store = storeConfig(env);
  const listen = env.WARREN_AGENT_LISTEN ?? "127.0.0.1:49700";
  const match = /^(.+):(\d+)$/.exec(listen);
  if (!match) throw new ConfigError(`WARREN_AGENT_LISTEN must be host:port, got '${listen}'`);
  const listenPort = Number(match[2]);
  if (listenPort > 65535) throw new ConfigError(`WARREN_AGENT_LISTEN port out of range: '${listen}'`);
  const instance = env.WARREN_INSTANCE ?? "a";
  if (!/^[a-z0-9]{1,4}$/.test(instance))
    throw new ConfigError(`WARREN_INSTANCE must match [a-z0-9]{1,4}, got '${instance}'`);
  const logLevel = env.WARREN_LOG_LEVEL ?? "info";
  if (!isLogLevel(logLevel)) {
    throw new ConfigError(`WARREN_LOG_LEVEL must be debug, info, warn or error, got '${logLevel}'`);
  }
  const driver = (env.WARREN_DRIVER || "auto") as DriverRequest;
  if (!DRIVER_REQUESTS.includes(driver)) {
    throw new ConfigError(`WARREN_DRIVER must be one of ${DRIVER_REQUESTS.join(", ")}, got '${driver}'`);
  }
  const microvmDir = env.WARREN_MICROVM_DIR || "/var/lib/warren/microvm";
  return {
    nodeId,
    listenHost: match[1]!,
    listenPort,
    nodeAddr: env.WARREN_NODE_ADDR ?? listen,
    redisUrl: env.WARREN_REDIS_URL ?? "redis://127.0.0.1:6379",
    redisPrefix: parseRedisPrefix(env.WARREN_REDIS_PREFIX),
    stateDir: env.WARREN_STATE_DIR ?? `/var/lib/warren/agent-${instance}`,
    templatesDir: env.WARREN_TEMPLATES_DIR ?? "/var/lib/warren/templates",
    volumesDir: env.WARREN_VOLUMES_DIR || "/var/lib/warren/volumes",
    instance,
    netCidr: env.WARREN_NET_CIDR ?? "10.201.0.0/16",
    poolSize: integer(env, "WARREN_POOL_SIZE", 2, 0, 100),
    poolMax: integer(env, "WARREN_POOL_MAX", 32, 0, 1000),
    poolWindowMs: integer(env, "WARREN_POOL_WINDOW_MS", 60_000, 1000, 24 * 3600_000),
    poolRefill: integer(env, "WARREN_POOL_REFILL", 2, 1, 64),
    poolRefillDelayMs: integer(env, "WARREN_POOL_REFILL_DELAY_MS", 200, 0, 60_000),
    poolTemplates: list(env, "WARREN_POOL_TEMPLATES", "base"),
    templatePools: integer(env, "WARREN_TEMPLATE_POOLS", 4, 0, 100),
    netPoolSize: integer(env, "WARREN_NET_POOL_SIZE", 4, 0, 1000),
    prebuildTemplates: list(env, "WARREN_PREBUILD_TEMPLATES", "base"),
    maxSandboxes: integer(env, "WARREN_MAX_SANDBOXES", 200, 1, 16000),
    maxConcurrentStarts: integer(env, "WARREN_MAX_CONCURRENT_STARTS", Math.max(2, cpus().length * 2), 1, 1024),
    maxQueuedStarts: integer(env, "WARREN_MAX_QUEUED_STARTS", 256, 0, 100_000),
    uidBase: integer(env, "WARREN_UID_BASE", 100000, 65536, 2 ** 31 - 65536),
    nodeBinary: env.WARREN_NODE_BINARY ?? process.execPath,
    envdRoot: env.WARREN_ENVD_ROOT ?? REPO_ROOT,
    debianMirror: env.WARREN_DEBIAN_MIRROR || undefined,
    heartbeatMs: integer(env, "WARREN_HEARTBEAT_MS", 5000, 100, 60000),
    readyTimeoutMs: integer(env, "WARREN_READY_TIMEOUT_MS", 15000, 1000, 600000),
    sandboxLogMaxBytes: integer(env, "WARREN_SANDBOX_LOG_MAX_BYTES", 8 << 20, 64 << 10, 2 ** 40),
    logLevel,
    criu: criuPath(env.WARREN_CRIU),
    toolSpawner: env.WARREN_TOOL_SPAWNER !== "0",
    dnsUpstream: env.WARREN_DNS_UPSTREAM || undefined,
    uplinkForwarding: env.WARREN_UPLINK_FORWARDING !== "0",
    diskOvercommit: ratioFromEnv(env, "WARREN_DISK_OVERCOMMIT", 1),
    checkpointAfterMs: integer(env, "WARREN_CHECKPOINT_AFTER_MS", 30_000, -1, 7 * 24 * 3600_000),
    killOnStop: ["1", "true", "yes"].includes((env.WARREN_KILL_ON_STOP ?? "").toLowerCase()),
    driver,
    microvmDir,
    microvmKernel: env.WARREN_MICROVM_KERNEL || `${microvmDir}/linux`,
    microvmBootTimeoutMs: integer(env, "WARREN_MICROVM_BOOT_TIMEOUT_MS", 0, 0, 3_600_000),
    microvmRamFile: env.WARREN_MICROVM_RAM_FILE !== "0",
    relayToken: relayToken(env.WARREN_RELAY_TOKEN),
    store,
    shareShippedTemplates: shareShippedTemplates(env.WARREN_SHARE_SHIPPED_TEMPLATES, store),
    packCacheMB: integer(env, "WARREN_PACK_CACHE_MB", 2048, 0, 2 ** 24),
    images: {
      ...(env.WARREN_IMAGE_MIRROR ? { dockerHubMirror: env.WARREN_IMAGE_MIRROR } : {}),
      insecureRegistries: list(env, "WARREN_INSECURE_REGISTRIES", ""),
      maxBytes: integer(env, "WARREN_IMAGE_MAX_BYTES", 8 * 2 ** 30, 1 << 20, 2 ** 44),
    },
  };
}
