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
 * Nodes that can take the sandbox, best first: a warm pool for the template beats a cached template beats
 * neither; ties go to the node with the most unreserved memory. `reservedMB` is what sandboxes already
 * placed there (including ones still starting) hold, from PostgreSQL, so it is never behind like a heartbeat.
 */
export function rankNodes(
  nodes: readonly NodeHeartbeat[],
  reservedMB: ReadonlyMap<string, number>,
  request: PlacementRequest,
  options: PlacementOptions,
): NodeHeartbeat[] {
  const scored = nodes.flatMap((node) => {
    const capacityMB = (node.memoryTotalBytes / (1024 * 1024)) * options.memoryOvercommit;
    const freeMB = capacityMB - (reservedMB.get(node.nodeId) ?? 0);
    if (freeMB < request.memoryMB) return [];
    const warm = (node.pools[request.templateId] ?? 0) > 0 ? 2 : 0;
    const cached = node.templates.includes(request.templateId) ? 1 : 0;
    return [{ node, score: warm + cached, freeMB }];
  });
  scored.sort((a, b) => b.score - a.score || b.freeMB - a.freeMB || a.node.nodeId.localeCompare(b.node.nodeId));
  return scored.map((entry) => entry.node);
}
