import type { Queryable } from "./db.js";
import type { BuildContext } from "./templates.js";

/** Cached step layers: a team's build results by E2B's step key (a files-only snapshot and the context after it). */

export interface LayerRecord {
  readonly key: string;
  readonly snapshotId: string;
  readonly nodeId: string;
  readonly context: BuildContext;
}

/** A cached layer whose snapshot is still live. */
export async function findLayer(db: Queryable, teamId: string, key: string): Promise<LayerRecord | undefined> {
  const result = await db.query(
    `SELECT l.* FROM template_layers l JOIN snapshots s ON s.id = l.snapshot_id AND s.deleted_at IS NULL
     WHERE l.team_id = $1 AND l.key = $2`,
    [teamId, key],
  );
  const row = result.rows[0];
  return row ? { key: row.key, snapshotId: row.snapshot_id, nodeId: row.node_id, context: row.context } : undefined;
}

export async function putLayer(db: Queryable, teamId: string, layer: LayerRecord): Promise<void> {
  await db.query(
    `INSERT INTO template_layers (team_id, key, snapshot_id, node_id, context) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (team_id, key) DO UPDATE SET snapshot_id = $3, node_id = $4, context = $5, created_at = now()`,
    [teamId, layer.key, layer.snapshotId, layer.nodeId, JSON.stringify(layer.context)],
  );
}

/**
 * Layers no live template's ready build uses any more (their template was deleted or rebuilt with other steps):
 * their cache entries go and their snapshots are marked deleted (the node sweep removes the files). Returns the
 * snapshot ids.
 */
export async function collectUnusedLayers(db: Queryable, teamId: string): Promise<string[]> {
  const result = await db.query<{ snapshot_id: string }>(
    `DELETE FROM template_layers l WHERE l.team_id = $1 AND NOT EXISTS (
       SELECT 1 FROM template_builds b JOIN templates t ON t.id = b.template_id AND t.deleted_at IS NULL
       WHERE b.team_id = $1 AND b.status IN ('ready', 'building', 'waiting') AND l.key = ANY(b.layer_keys))
     RETURNING l.snapshot_id`,
    [teamId],
  );
  const ids = result.rows.map((r) => r.snapshot_id);
  if (ids.length > 0) {
    await db.query("UPDATE snapshots SET deleted_at = now() WHERE id = ANY($1) AND kind = 'layer'", [ids]);
  }
  return ids;
}
