import type { Queryable } from "./db.js";

export interface NodeRow {
  readonly id: string;
  readonly addr: string;
  readonly state: "up" | "down";
  readonly lastSeenAt: Date;
  /** Set while an operator has cordoned the node. */
  readonly cordonedAt: Date | null;
}

export async function listNodes(db: Queryable): Promise<NodeRow[]> {
  const result = await db.query("SELECT * FROM nodes ORDER BY id");
  return result.rows.map((row) => ({
    id: row.id,
    addr: row.addr,
    state: row.state,
    lastSeenAt: row.last_seen_at,
    cordonedAt: row.cordoned_at,
  }));
}

/** Cordons (true) or uncordons a known node; false when the node is unknown. */
export async function setNodeCordon(db: Queryable, id: string, cordoned: boolean): Promise<boolean> {
  const result = await db.query(
    `UPDATE nodes SET cordoned_at = CASE WHEN $2 THEN COALESCE(cordoned_at, now()) ELSE NULL END WHERE id = $1`,
    [id, cordoned],
  );
  return (result.rowCount ?? 0) > 0;
}

export async function cordonedNodeIds(db: Queryable): Promise<Set<string>> {
  const result = await db.query<{ id: string }>("SELECT id FROM nodes WHERE cordoned_at IS NOT NULL");
  return new Set(result.rows.map((row) => row.id));
}

/** Records a node seen alive; returns true when it was unknown or down before. */
export async function markNodeUp(db: Queryable, id: string, addr: string, seenAt: Date): Promise<boolean> {
  const result = await db.query<{ was: string | null }>(
    `WITH prev AS (SELECT state FROM nodes WHERE id = $1)
     INSERT INTO nodes (id, addr, state, last_seen_at) VALUES ($1, $2, 'up', $3)
     ON CONFLICT (id) DO UPDATE SET addr = $2, last_seen_at = $3, state = 'up',
       changed_at = CASE WHEN nodes.state = 'up' THEN nodes.changed_at ELSE now() END
     RETURNING (SELECT state FROM prev) AS was`,
    [id, addr, seenAt],
  );
  return result.rows[0]?.was !== "up";
}

/** Marks a node down; returns true when it was up before. */
export async function markNodeDown(db: Queryable, id: string): Promise<boolean> {
  const result = await db.query("UPDATE nodes SET state = 'down', changed_at = now() WHERE id = $1 AND state = 'up'", [
    id,
  ]);
  return (result.rowCount ?? 0) > 0;
}

export interface TemplateRow {
  readonly id: string;
  readonly alias: string | null;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
}

/** A template by id or alias (`name:tag` resolves to `name`, the only tag for now). */
export async function findTemplate(db: Queryable, ref: string): Promise<TemplateRow | undefined> {
  const name = ref.replace(/:default$/, "");
  const result = await db.query(
    "SELECT * FROM templates WHERE (id = $1 OR alias = $1) AND team_id IS NULL AND deleted_at IS NULL",
    [name],
  );
  const row = result.rows[0];
  if (!row) return undefined;
  return {
    id: row.id,
    alias: row.alias,
    cpuCount: row.cpu_count,
    memoryMB: row.memory_mb,
    diskSizeMB: row.disk_size_mb,
    envdVersion: row.envd_version,
  };
}

/** Memory (MB) reserved on each node by sandboxes that hold resources there. */
export async function reservedMemoryByNode(db: Queryable): Promise<Map<string, number>> {
  const result = await db.query<{ node_id: string; mb: string }>(
    `SELECT node_id, sum(memory_mb) AS mb FROM sandboxes
     WHERE node_id IS NOT NULL AND state IN ('starting','running','pausing','resuming') GROUP BY node_id`,
  );
  return new Map(result.rows.map((row) => [row.node_id, Number(row.mb)]));
}
