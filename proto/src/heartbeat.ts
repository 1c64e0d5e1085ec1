/**
 * A node agent's heartbeat: the hash at `warren:node:<nodeId>` (`nodeKey` in ./redis.ts). The node agent encodes
 * it (`heartbeatToHash`), the master decodes it (`heartbeatFromHash`); both through this one module so the field
 * names and encodings cannot drift apart.
 */

/** Capacity a node agent reports in its heartbeat. */
export interface NodeHeartbeat {
  readonly nodeId: string;
  readonly addr: string;
  readonly driver: string;
  readonly cpuCount: number;
  readonly memoryTotalBytes: number;
  readonly memoryFreeBytes: number;
  readonly sandboxes: number;
  /** Template id → ready sandboxes waiting in the warm pool. */
  readonly pools: Readonly<Record<string, number>>;
  readonly templates: readonly string[];
  /**
   * Templates this node's driver may run at all, built or not (a template can require a driver); absent from
   * older agents, which serve every template.
   */
  readonly servable?: readonly string[];
  /**
   * Shipped templates this node waits for the master's template builder to build for it (node agents whose driver
   * takes a build's layers); the master builds each on the node and hands it over (AdoptTemplate).
   */
  readonly templatesWanted?: readonly string[];
  readonly updatedAt: number;
}

/** The Redis hash fields of a heartbeat: numbers as decimal text, lists and maps as JSON. */
export function heartbeatToHash(beat: NodeHeartbeat): Record<string, string> {
  return {
    nodeId: beat.nodeId,
    addr: beat.addr,
    driver: beat.driver,
    cpuCount: String(beat.cpuCount),
    memoryTotalBytes: String(beat.memoryTotalBytes),
    memoryFreeBytes: String(beat.memoryFreeBytes),
    sandboxes: String(beat.sandboxes),
    pools: JSON.stringify(beat.pools),
    templates: JSON.stringify(beat.templates),
    ...(beat.servable ? { servable: JSON.stringify(beat.servable) } : {}),
    ...(beat.templatesWanted ? { templatesWanted: JSON.stringify(beat.templatesWanted) } : {}),
    updatedAt: String(beat.updatedAt),
  };
}

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

/**
 * Parses the hash read at `nodeKey(nodeId)`; undefined when it is absent or has no address. Lenient on the rest
 * (a malformed number is 0, malformed JSON its empty value) so one odd field does not hide a live node; `templates`
 * may also be the comma-separated list older agents wrote.
 */
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
    ...(hash.servable ? { servable: parseJson<string[]>(hash.servable, []) } : {}),
    ...(hash.templatesWanted ? { templatesWanted: parseJson<string[]>(hash.templatesWanted, []) } : {}),
    updatedAt: parseNumber(hash.updatedAt),
  };
}
