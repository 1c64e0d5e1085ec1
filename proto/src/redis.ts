/**
 * The Redis contract between the node agent (writer) and the proxy (reader): every key,
 * channel and field name Warren uses in Redis is built here and nowhere else.
 *
 * Keys
 *   warren:route:<sandboxId>   hash  SandboxRoute (fields below); written by the node agent that hosts the sandbox
 *   warren:node:<nodeId>       hash  NodeHeartbeat (./heartbeat.ts); expires unless the agent refreshes it (NODE_TTL_SECONDS)
 *   warren:nodes               set   ids of every node that has sent a heartbeat
 *   warren:crash:<sandboxId>   string why a node found the sandbox dead (crashKey)
 *   warren:template-build:<name> string the node building a shipped template for the cluster (templateBuildClaimKey)
 * Channel
 *   warren:route-events        JSON RouteEvent on every route change; proxies drop cached routes on it
 * All of them under WARREN_REDIS_PREFIX when it is set (below).
 *
 * Incarnations: every start or resume of a sandbox gets a new `exec` id and a larger `generation`.
 * A write carrying an older generation, or a delete naming another exec, never clobbers the current
 * route (the Lua scripts below make both compare-and-set).
 */

export const ROUTE_EVENTS_CHANNEL = "warren:route-events";
export const NODES_SET_KEY = "warren:nodes";
export const NODE_TTL_SECONDS = 15;

/**
 * WARREN_REDIS_PREFIX (default empty) puts every key and channel above under a prefix, so several Warren
 * deployments (or test runs) can share one Redis; every process of one deployment (master, node agents,
 * proxies) must use the same prefix. Keys get it from the client (ioredis `keyPrefix`, which also prefixes
 * the scripts' KEYS); ioredis never prefixes channel names or SCAN patterns, so those are built here.
 */
export const REDIS_PREFIX_ENV = "WARREN_REDIS_PREFIX";
const REDIS_PREFIX = /^[A-Za-z0-9_.:-]{0,64}$/;
const ROUTE_KEY_STEM = "warren:route:";

/** The prefix from WARREN_REDIS_PREFIX's value; throws on anything but 0–64 of `A-Z a-z 0-9 _ . : -`. */
export function parseRedisPrefix(text: string | undefined): string {
  const prefix = text ?? "";
  if (!REDIS_PREFIX.test(prefix)) {
    throw new Error(`${REDIS_PREFIX_ENV} must be 0-64 of A-Z a-z 0-9 _ . : -, got '${prefix}'`);
  }
  return prefix;
}

/** The route-events channel of a deployment with this key prefix. */
export function routeEventsChannel(prefix: string): string {
  return `${prefix}${ROUTE_EVENTS_CHANNEL}`;
}

/** SCAN/KEYS pattern of every route key under this prefix (patterns are never prefixed by the client). */
export function routeKeyPattern(prefix: string): string {
  return `${prefix}${ROUTE_KEY_STEM}*`;
}

/** The sandbox id of a full key SCAN returned (prefix included); undefined when it is no route key. */
export function sandboxIdOfRouteKey(key: string, prefix: string): string | undefined {
  const stem = `${prefix}${ROUTE_KEY_STEM}`;
  if (!key.startsWith(stem)) return undefined;
  const id = key.slice(stem.length);
  return isSandboxId(id) ? id : undefined;
}

// No dashes: a sandbox id must survive the `<port>-<sandboxId>.<domain>` host form.
const SANDBOX_ID = /^[a-z0-9]{1,63}$/;
const NODE_ID = /^[a-z0-9][a-z0-9-]{0,62}$/;

export function isSandboxId(id: string): boolean {
  return SANDBOX_ID.test(id);
}

// Snapshot ids name directories on nodes (and E2B template ids): no dots, no slashes.
const SNAPSHOT_ID = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export function isSnapshotId(id: string): boolean {
  return SNAPSHOT_ID.test(id);
}

export function isNodeId(id: string): boolean {
  return NODE_ID.test(id);
}

export function routeKey(sandboxId: string): string {
  if (!isSandboxId(sandboxId)) throw new Error(`invalid sandbox id '${sandboxId}'`);
  return `${ROUTE_KEY_STEM}${sandboxId}`;
}

/**
 * `warren:crash:<sandboxId>` (string, 10 min TTL): why a node agent found a sandbox dead and removed it (its
 * PID 1 exited: envd died, or was killed). The master's reconciler records it with the sandbox's loss.
 */
export function crashKey(sandboxId: string): string {
  if (!isSandboxId(sandboxId)) throw new Error(`invalid sandbox id '${sandboxId}'`);
  return `warren:crash:${sandboxId}`;
}

export const CRASH_TTL_SECONDS = 600;

export function nodeKey(nodeId: string): string {
  if (!isNodeId(nodeId)) throw new Error(`invalid node id '${nodeId}'`);
  return `warren:node:${nodeId}`;
}

/**
 * `warren:template-build:<id>-<key>` (string, expires): the one node building a shipped template (a recipe of the
 * node agent's catalog, identified by its content key) for the whole cluster, which then publishes it to the
 * template store for the others to pull. Value: a token naming the holder (node id + random); renewed while it
 * builds, removed by compare-and-delete (CLAIM_RELEASE_SCRIPT). A holder that dies lets it expire and another
 * node takes it over.
 */
export function templateBuildClaimKey(name: string): string {
  if (!TEMPLATE_BUILD_NAME.test(name)) throw new Error(`invalid template build name '${name}'`);
  return `warren:template-build:${name}`;
}

const TEMPLATE_BUILD_NAME = /^[a-z0-9][a-z0-9_.-]{0,127}$/;
export const TEMPLATE_BUILD_CLAIM_TTL_MS = 60_000;

/** KEYS[1]=claim key; ARGV[1]=holder token, ARGV[2]=ttl ms. Extends the claim if still held by that token: 1, else 0. */
export const CLAIM_RENEW_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
`;

/** KEYS[1]=claim key; ARGV[1]=holder token. Deletes the claim if still held by that token: 1, else 0. */
export const CLAIM_RELEASE_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
`;

export type RouteState = "running" | "pausing" | "paused" | "resuming";
const ROUTE_STATES: readonly RouteState[] = ["running", "pausing", "paused", "resuming"];

/** Where a sandbox's traffic goes, as the proxy needs it. */
export interface SandboxRoute {
  readonly sandboxId: string;
  /** Incarnation id: changes on every start/resume. */
  readonly exec: string;
  /** Orders incarnations: a larger generation is newer. */
  readonly generation: number;
  readonly node: string;
  /** The node agent's address (host:port), for control calls such as resume. */
  readonly nodeAddr: string;
  /** The sandbox's own address as reachable from the node (IP); any port on it is the sandbox's port. */
  readonly sandboxAddr: string;
  /** Container port → reachable host:port, for ports mapped elsewhere than sandboxAddr:port. */
  readonly ports: Readonly<Record<string, string>>;
  readonly state: RouteState;
  readonly team: string;
  /** Public traffic: when false, non-envd ports need the traffic token. */
  readonly public: boolean;
  /** SHA-256 hex of the traffic access token, empty when none. */
  readonly trafficTokenHash: string;
  readonly autoResume: boolean;
  /**
   * Host header to send to non-envd ports instead of the client's (`${PORT}` is replaced by the
   * port); empty keeps the client's Host.
   */
  readonly maskRequestHost: string;
  /** The user envd runs a request as when it names none (the exec policy's `asRoot` needs it); absent: `user`. */
  readonly defaultUser?: string;
}

export function routeToHash(route: SandboxRoute): Record<string, string> {
  return {
    sandboxId: route.sandboxId,
    exec: route.exec,
    generation: String(route.generation),
    node: route.node,
    nodeAddr: route.nodeAddr,
    sandboxAddr: route.sandboxAddr,
    ports: JSON.stringify(route.ports),
    state: route.state,
    team: route.team,
    public: route.public ? "1" : "0",
    trafficTokenHash: route.trafficTokenHash,
    autoResume: route.autoResume ? "1" : "0",
    maskRequestHost: route.maskRequestHost,
    ...(route.defaultUser ? { defaultUser: route.defaultUser } : {}),
  };
}

/** Parses a route hash read from Redis; undefined when it is missing or not a complete route. */
export function routeFromHash(hash: Record<string, string> | null | undefined): SandboxRoute | undefined {
  if (!hash?.exec || !hash.sandboxId || !hash.sandboxAddr) return undefined;
  const state = hash.state as RouteState;
  if (!ROUTE_STATES.includes(state)) return undefined;
  let ports: Record<string, string> = {};
  try {
    const parsed: unknown = JSON.parse(hash.ports || "{}");
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) ports = parsed as Record<string, string>;
  } catch {
    return undefined;
  }
  return {
    sandboxId: hash.sandboxId,
    exec: hash.exec,
    generation: Number(hash.generation ?? 0),
    node: hash.node ?? "",
    nodeAddr: hash.nodeAddr ?? "",
    sandboxAddr: hash.sandboxAddr,
    ports,
    state,
    team: hash.team ?? "",
    // Fail closed: a route without the field is private.
    public: hash.public === "1",
    trafficTokenHash: hash.trafficTokenHash ?? "",
    autoResume: hash.autoResume === "1",
    maskRequestHost: hash.maskRequestHost ?? "",
    ...(hash.defaultUser ? { defaultUser: hash.defaultUser } : {}),
  };
}

/** Published on ROUTE_EVENTS_CHANNEL; state "deleted" means the route is gone. */
export interface RouteEvent {
  readonly sandboxId: string;
  readonly exec: string;
  readonly generation: number;
  readonly state: RouteState | "deleted";
}

export function parseRouteEvent(message: string): RouteEvent | undefined {
  try {
    const event = JSON.parse(message) as Partial<RouteEvent>;
    if (typeof event.sandboxId !== "string" || typeof event.exec !== "string" || typeof event.state !== "string") {
      return undefined;
    }
    return {
      sandboxId: event.sandboxId,
      exec: event.exec,
      generation: Number(event.generation ?? 0),
      state: event.state,
    };
  } catch {
    return undefined;
  }
}

/**
 * KEYS[1]=route key; ARGV[1]=channel, ARGV[2]=generation, ARGV[3]=event JSON, ARGV[4..]=field/value pairs.
 * Writes the route unless the stored one has a larger generation. Returns 1 if written, 0 if stale.
 */
export const WRITE_ROUTE_SCRIPT = `
local current = redis.call('HGET', KEYS[1], 'generation')
if current and tonumber(current) > tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('PUBLISH', ARGV[1], ARGV[3])
return 1
`;

/**
 * KEYS[1]=route key; ARGV[1]=channel, ARGV[2]=exec, ARGV[3]=event JSON.
 * Deletes the route only if it still belongs to incarnation `exec`. Returns 1 if deleted.
 */
export const DELETE_ROUTE_SCRIPT = `
if redis.call('HGET', KEYS[1], 'exec') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[3])
return 1
`;

// The heartbeat hash at nodeKey: its type and codec live in ./heartbeat.ts, part of this contract.
export { heartbeatFromHash, heartbeatToHash, type NodeHeartbeat } from "./heartbeat.js";
