import { decodeTimeCursor, encodeTimeCursor } from "./cursor.js";
import type { Queryable } from "./db.js";

export type SnapshotKind = "snapshot" | "fork" | "template" | "layer" | "durable";

/** A snapshot of a sandbox, kept as files on one node (the node agent's Snapshot RPC). */
export interface SnapshotRow {
  readonly id: string;
  readonly teamId: string;
  readonly name: string | null;
  readonly kind: SnapshotKind;
  readonly sourceSandboxId: string;
  readonly nodeId: string;
  readonly templateId: string;
  readonly driver: string;
  /** Processes and memory are in it (sandboxes from it continue them); false: files only. */
  readonly memory: boolean;
  readonly sizeBytes: number;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envVars: Record<string, string>;
  readonly metadata: Record<string, string>;
  /** Published to the cluster's store with this content digest (any node with its driver can pull it). */
  readonly digest: string | null;
  readonly createdAt: Date;
}

// biome-ignore lint/suspicious/noExplicitAny: raw pg row
function toSnapshotRow(row: any): SnapshotRow {
  return {
    id: row.id,
    teamId: row.team_id,
    name: row.name,
    kind: row.kind,
    sourceSandboxId: row.source_sandbox_id,
    nodeId: row.node_id,
    templateId: row.template_id,
    driver: row.driver,
    memory: row.memory,
    sizeBytes: Number(row.size_bytes),
    cpuCount: row.cpu_count,
    memoryMB: row.memory_mb,
    diskSizeMB: row.disk_size_mb,
    envVars: row.env_vars ?? {},
    metadata: row.metadata ?? {},
    digest: row.digest ?? null,
    createdAt: row.created_at,
  };
}

/** The tag every snapshot has (E2B names builds `name:tag`; a snapshot here is one build). */
export const SNAPSHOT_TAG = "default";

/** E2B's snapshot template names: lowercase letters, digits, dashes and underscores. */
export const SNAPSHOT_NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/** The team's namespace in snapshot names (`<namespace>/<name>:<tag>`): its name, slugged. */
export function teamNamespace(teamName: string): string {
  return (
    teamName
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, "-")
      .replace(/^-+|-+$/g, "") || "team"
  );
}

/** E2B's SnapshotInfo.snapshotID: the namespaced name with tag when named, else the id with tag. */
export function snapshotRef(row: Pick<SnapshotRow, "id" | "name">, namespace: string): string {
  return row.name ? `${namespace}/${row.name}:${SNAPSHOT_TAG}` : `${row.id}:${SNAPSHOT_TAG}`;
}

/**
 * A reference as clients give it (templateID in create, DELETE /templates/{id}, the list's name filter): `id`,
 * `name`, `namespace/name`, each optionally `:default`. Another namespace or tag matches nothing.
 */
export function parseSnapshotRef(ref: string, namespace: string): { idOrName: string } | undefined {
  let rest = ref;
  const colon = rest.lastIndexOf(":");
  if (colon >= 0) {
    if (rest.slice(colon + 1) !== SNAPSHOT_TAG) return undefined;
    rest = rest.slice(0, colon);
  }
  const slash = rest.indexOf("/");
  if (slash >= 0) {
    if (rest.slice(0, slash) !== namespace) return undefined;
    rest = rest.slice(slash + 1);
  }
  return SNAPSHOT_NAME.test(rest) ? { idOrName: rest } : undefined;
}

/** A live snapshot of the team by id or name. */
export async function findSnapshot(
  db: Queryable,
  teamId: string,
  idOrName: string,
  kinds: readonly SnapshotKind[] = ["snapshot"],
): Promise<SnapshotRow | undefined> {
  const result = await db.query(
    `SELECT * FROM snapshots WHERE team_id = $1 AND (id = $2 OR name = $2) AND deleted_at IS NULL AND kind = ANY($3)
     ORDER BY (id = $2) DESC LIMIT 1`,
    [teamId, idOrName, kinds],
  );
  return result.rows[0] ? toSnapshotRow(result.rows[0]) : undefined;
}

/** Team snapshots (kind `snapshot`) not yet published to the cluster's store, oldest first. */
export async function unpublishedSnapshots(db: Queryable, limit: number): Promise<SnapshotRow[]> {
  const result = await db.query(
    `SELECT * FROM snapshots WHERE kind = 'snapshot' AND deleted_at IS NULL AND digest IS NULL
       AND node_id IN (SELECT id FROM nodes WHERE state = 'up')
     ORDER BY created_at LIMIT $1`,
    [limit],
  );
  return result.rows.map(toSnapshotRow);
}

/**
 * What a sandbox's next durable copy is packed against (snapshot-packs.ts): its newest durable copy in the store
 * (its last pause's, kept a while after it resumed), else the published ready snapshot of the template build it
 * started from (its memory began as that snapshot's).
 */
export async function packBaseFor(db: Queryable, sandboxId: string): Promise<string | undefined> {
  const result = await db.query<{ id: string }>(
    `SELECT id FROM (
       SELECT id, 0 AS rank, created_at FROM snapshots
        WHERE source_sandbox_id = $1 AND kind = 'durable' AND digest IS NOT NULL AND deleted_at IS NULL
       UNION ALL
       SELECT s.id, 1, s.created_at FROM sandboxes x
         JOIN template_builds b ON b.id = x.build_id JOIN snapshots s ON s.id = b.snapshot_id
        WHERE x.id = $1 AND s.digest IS NOT NULL AND s.deleted_at IS NULL
     ) candidates ORDER BY rank, created_at DESC LIMIT 1`,
    [sandboxId],
  );
  return result.rows[0]?.id;
}

/** A live snapshot of any kind by id (a template build's ready snapshot or layer, too). */
export async function getLiveSnapshot(db: Queryable, id: string): Promise<SnapshotRow | undefined> {
  const result = await db.query("SELECT * FROM snapshots WHERE id = $1 AND deleted_at IS NULL", [id]);
  return result.rows[0] ? toSnapshotRow(result.rows[0]) : undefined;
}

export interface NewSnapshot extends Omit<SnapshotRow, "createdAt" | "digest"> {}

/** Records that a snapshot is no longer in the store (its row, if any, was deleted). */
export async function clearSnapshotDigest(db: Queryable, id: string): Promise<void> {
  await db.query("UPDATE snapshots SET digest = NULL WHERE id = $1", [id]);
}

/** Records that a snapshot was published to the store with `digest`. */
export async function setSnapshotDigest(db: Queryable, id: string, digest: string): Promise<void> {
  await db.query("UPDATE snapshots SET digest = $2 WHERE id = $1", [id, digest]);
}

/** The nodes holding a snapshot: the one that made it and those that pulled a copy. */
export async function snapshotHolders(db: Queryable, snapshot: SnapshotRow): Promise<Set<string>> {
  const result = await db.query<{ node_id: string }>("SELECT node_id FROM snapshot_copies WHERE snapshot_id = $1", [
    snapshot.id,
  ]);
  return new Set([snapshot.nodeId, ...result.rows.map((r) => r.node_id)]);
}

export async function recordSnapshotCopy(db: Queryable, snapshotId: string, nodeId: string): Promise<void> {
  await db.query("INSERT INTO snapshot_copies (snapshot_id, node_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", [
    snapshotId,
    nodeId,
  ]);
}

/**
 * Records a snapshot the node has made. A named one takes the name over from an older snapshot of the team (E2B:
 * a new build of the same snapshot template); that older one is returned, marked deleted, for its files to go.
 */
export async function insertSnapshot(
  db: Queryable,
  s: NewSnapshot,
): Promise<{ row: SnapshotRow; replaced: SnapshotRow | undefined }> {
  let replaced: SnapshotRow | undefined;
  if (s.name) {
    const old = await db.query(
      `UPDATE snapshots SET deleted_at = now() WHERE team_id = $1 AND name = $2 AND deleted_at IS NULL RETURNING *`,
      [s.teamId, s.name],
    );
    replaced = old.rows[0] ? toSnapshotRow(old.rows[0]) : undefined;
  }
  const result = await db.query(
    `INSERT INTO snapshots (id, team_id, name, kind, source_sandbox_id, node_id, template_id, driver, memory,
       size_bytes, cpu_count, memory_mb, disk_size_mb, env_vars, metadata)
     VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15) RETURNING *`,
    [
      s.id,
      s.teamId,
      s.name,
      s.kind,
      s.sourceSandboxId,
      s.nodeId,
      s.templateId,
      s.driver,
      s.memory,
      s.sizeBytes,
      s.cpuCount,
      s.memoryMB,
      s.diskSizeMB,
      JSON.stringify(s.envVars),
      JSON.stringify(s.metadata),
    ],
  );
  return { row: toSnapshotRow(result.rows[0]), replaced };
}

/** Marks a snapshot deleted; returns it when it was live. */
export async function markSnapshotDeleted(db: Queryable, id: string): Promise<SnapshotRow | undefined> {
  const result = await db.query(
    "UPDATE snapshots SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL RETURNING *",
    [id],
  );
  return result.rows[0] ? toSnapshotRow(result.rows[0]) : undefined;
}

export interface SnapshotListQuery {
  readonly sandboxId?: string;
  /** id or name (already stripped of namespace and tag). */
  readonly idOrName?: string;
  readonly limit: number;
  readonly nextToken?: string;
}

/**
 * One page of the team's listed snapshots, newest first, with a cursor when more remain (compared at millisecond
 * precision, which is what the cursor carries).
 */
export async function listSnapshots(
  db: Queryable,
  teamId: string,
  query: SnapshotListQuery,
): Promise<{ rows: SnapshotRow[]; nextToken: string | undefined }> {
  const cursor = query.nextToken ? decodeTimeCursor(query.nextToken) : undefined;
  if (query.nextToken && !cursor) throw new Error("invalid nextToken");
  const result = await db.query(
    `SELECT * FROM snapshots
     WHERE team_id = $1 AND kind = 'snapshot' AND deleted_at IS NULL
       AND ($2::text IS NULL OR source_sandbox_id = $2)
       AND ($3::text IS NULL OR id = $3 OR name = $3)
       AND ($4::timestamptz IS NULL OR (date_trunc('milliseconds', created_at), id) < ($4, $5))
     ORDER BY date_trunc('milliseconds', created_at) DESC, id DESC LIMIT $6`,
    [teamId, query.sandboxId ?? null, query.idOrName ?? null, cursor?.at ?? null, cursor?.id ?? null, query.limit + 1],
  );
  const rows = result.rows.map(toSnapshotRow);
  const more = rows.length > query.limit;
  const page = rows.slice(0, query.limit);
  const last = page[page.length - 1];
  return {
    rows: page,
    nextToken: more && last ? encodeTimeCursor(last.createdAt, last.id) : undefined,
  };
}

/** Fork captures a master never got to delete (it stopped mid-fork), older than `graceMs`: marked deleted now. */
export async function expireForkCaptures(db: Queryable, graceMs: number): Promise<number> {
  const result = await db.query(
    `UPDATE snapshots SET deleted_at = now()
     WHERE kind = 'fork' AND deleted_at IS NULL AND created_at < now() - make_interval(secs => $1)`,
    [graceMs / 1000],
  );
  return result.rowCount ?? 0;
}

/** Which of `ids` are live snapshots (recorded and not deleted). */
export async function liveSnapshotIds(db: Queryable, ids: readonly string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const result = await db.query<{ id: string }>("SELECT id FROM snapshots WHERE id = ANY($1) AND deleted_at IS NULL", [
    ids,
  ]);
  return new Set(result.rows.map((r) => r.id));
}
