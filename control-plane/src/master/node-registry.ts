import { NODES_SET_KEY, type NodeHeartbeat, nodeKey } from "@warren/proto/redis";
import type { Redis } from "ioredis";

function parseNumber(value: string | undefined): number {
  const n = Number(value ?? 0);
  return Number.isFinite(n) ? n : 0;
}

function parseJson<T>(value: string | undefined, fallback: T): T {
  if (!value) return fallback;
  try {
    return JSON.parse(value) as T;
  } catch {
    return fallback;
  }
}

/** Parses the heartbeat hash a node agent writes at warren:node:<id>; undefined when absent or incomplete. */
export function heartbeatFromHash(nodeId: string, hash: Record<string, string>): NodeHeartbeat | undefined {
  if (!hash.addr) return undefined;
  const templates = hash.templates?.startsWith("[")
    ? parseJson<string[]>(hash.templates, [])
    : (hash.templates ?? "").split(",").filter(Boolean);
  return {
    nodeId: hash.nodeId || nodeId,
    addr: hash.addr,
    driver: hash.driver ?? "",
    cpuCount: parseNumber(hash.cpuCount),
    memoryTotalBytes: parseNumber(hash.memoryTotalBytes),
    memoryFreeBytes: parseNumber(hash.memoryFreeBytes),
    sandboxes: parseNumber(hash.sandboxes),
    pools: parseJson<Record<string, number>>(hash.pools, {}),
    templates,
    updatedAt: parseNumber(hash.updatedAt),
  };
}

export interface NodeView {
  readonly nodeId: string;
  /** Undefined when the node is in warren:nodes but its heartbeat key expired. */
  readonly heartbeat?: NodeHeartbeat;
}

/** Reads node liveness and capacity from the heartbeats node agents keep in Redis. */
export class NodeRegistry {
  constructor(private readonly redis: Redis) {}

  async nodes(): Promise<NodeView[]> {
    const ids = (await this.redis.smembers(NODES_SET_KEY)).sort();
    if (ids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hgetall(nodeKey(id));
    const results = (await pipeline.exec()) ?? [];
    return ids.map((nodeId, i) => {
      const hash = (results[i]?.[1] ?? {}) as Record<string, string>;
      const heartbeat = heartbeatFromHash(nodeId, hash);
      return heartbeat ? { nodeId, heartbeat } : { nodeId };
    });
  }

  async liveNodes(): Promise<NodeHeartbeat[]> {
    return (await this.nodes()).flatMap((node) => (node.heartbeat ? [node.heartbeat] : []));
  }
}
