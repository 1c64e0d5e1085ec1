import type { NodeHeartbeat } from "@warren/proto/redis";

export interface PlacementRequest {
  readonly templateId: string;
  readonly memoryMB: number;
}

export interface PlacementOptions {
  /** Memory a node may promise to sandboxes, as a multiple of its physical memory. */
  readonly memoryOvercommit: number;
}

/**
 * Placements this master made recently, by node and template. A heartbeat's pool count is up to a
 * heartbeat period old, so within a burst of creates every node would look as warm as at its last
 * heartbeat and one node would take them all, cold-starting past its pool (measured: 83 of 100
 * concurrent creates on one of two nodes, p99 9 s). Subtracting what was placed since a node's
 * heartbeat estimates the pool that is really left.
 */
export class RecentPlacements {
  private entries: { nodeId: string; templateId: string; at: number }[] = [];

  constructor(private readonly keepMs = 60_000) {}

  record(nodeId: string, templateId: string, at = Date.now()): void {
    this.entries.push({ nodeId, templateId, at });
    if (this.entries.length > 1024) this.prune(at);
  }

  /** Placements of `templateId` on `nodeId` after `sinceMs` (epoch ms). */
  count(nodeId: string, templateId: string, sinceMs: number): number {
    this.prune(Date.now());
    return this.entries.filter((e) => e.nodeId === nodeId && e.templateId === templateId && e.at > sinceMs).length;
  }

  private prune(now: number): void {
    this.entries = this.entries.filter((e) => now - e.at < this.keepMs);
  }
}

/**
 * Nodes that can take the sandbox, best first: a warm pool for the template beats a cached template beats
 * neither; then the larger pool left (heartbeat count minus `recent` placements since that heartbeat), then
 * the most unreserved memory. `reservedMB` is what sandboxes already placed there (including ones still
 * starting) hold, from PostgreSQL, so it is never behind like a heartbeat.
 */
export function rankNodes(
  nodes: readonly NodeHeartbeat[],
  reservedMB: ReadonlyMap<string, number>,
  request: PlacementRequest,
  options: PlacementOptions,
  recent?: RecentPlacements,
): NodeHeartbeat[] {
  const scored = nodes.flatMap((node) => {
    // A template that requires another driver than this node's (an agent that says which it serves).
    if (node.servable && !node.servable.includes(request.templateId)) return [];
    const capacityMB = (node.memoryTotalBytes / (1024 * 1024)) * options.memoryOvercommit;
    const freeMB = capacityMB - (reservedMB.get(node.nodeId) ?? 0);
    if (freeMB < request.memoryMB) return [];
    const placedSince = recent?.count(node.nodeId, request.templateId, node.updatedAt) ?? 0;
    const poolLeft = (node.pools[request.templateId] ?? 0) - placedSince;
    const warm = poolLeft > 0 ? 2 : 0;
    const cached = node.templates.includes(request.templateId) ? 1 : 0;
    return [{ node, score: warm + cached, poolLeft: Math.max(0, poolLeft), freeMB }];
  });
  scored.sort(
    (a, b) =>
      b.score - a.score || b.poolLeft - a.poolLeft || b.freeMB - a.freeMB || a.node.nodeId.localeCompare(b.node.nodeId),
  );
  return scored.map((entry) => entry.node);
}
