import { randomBytes } from "node:crypto";
import type { Queryable } from "./db.js";

/**
 * Templates, their builds, build logs, tags, uploaded COPY archives and cached step layers (E2B's template API,
 * `shared/E2B-TEMPLATES.md`). A template with `teamId` null ships with Warren (the null namespace: public to every
 * team, built by the node agents from recipes); every other one belongs to a team.
 */

export type BuildStatus = "waiting" | "building" | "ready" | "error";

export interface TemplateRecord {
  readonly id: string;
  readonly teamId: string | null;
  readonly alias: string | null;
  readonly public: boolean;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
  readonly spawnCount: number;
  readonly lastSpawnedAt: Date | null;
  readonly createdAt: Date;
  readonly updatedAt: Date;
}

/** What the builder keeps of a step's context (E2B: user, workdir, env) and what sandboxes start with. */
export interface BuildContext {
  readonly user: string;
  /** null: the user's home. */
  readonly workdir: string | null;
  readonly env: Readonly<Record<string, string>>;
}

export interface BuildReason {
  readonly message: string;
  readonly step?: string;
}

export interface BuildRecord {
  readonly id: string;
  readonly templateId: string;
  readonly teamId: string;
  readonly status: BuildStatus;
  readonly reason: BuildReason | null;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
  readonly spec: Record<string, unknown> | null;
  readonly nodeId: string | null;
  readonly snapshotId: string | null;
  readonly layerSnapshotId: string | null;
  readonly baseTemplateId: string | null;
  readonly startCmd: string | null;
  readonly readyCmd: string | null;
  readonly defaultUser: string | null;
  readonly defaultWorkdir: string | null;
  readonly envVars: Record<string, string>;
  readonly layerKeys: string[];
  readonly buildSandboxId: string | null;
  readonly tokenNonce: string | null;
  readonly createdAt: Date;
  readonly updatedAt: Date;
  readonly finishedAt: Date | null;
}

export interface BuildLogEntry {
  readonly timestamp: Date;
  readonly level: "debug" | "info" | "warn" | "error";
  readonly message: string;
  readonly step?: string;
}

// biome-ignore lint/suspicious/noExplicitAny: raw pg row
function toTemplate(row: any): TemplateRecord {
  return {
    id: row.id,
    teamId: row.team_id,
    alias: row.alias,
    public: row.public,
    cpuCount: row.cpu_count,
    memoryMB: row.memory_mb,
    diskSizeMB: row.disk_size_mb,
    envdVersion: row.envd_version,
    spawnCount: Number(row.spawn_count ?? 0),
    lastSpawnedAt: row.last_spawned_at ?? null,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

// biome-ignore lint/suspicious/noExplicitAny: raw pg row
export function toBuild(row: any): BuildRecord {
  return {
    id: row.id,
    templateId: row.template_id,
    teamId: row.team_id,
    status: row.status,
    reason: row.reason ?? null,
    cpuCount: row.cpu_count,
    memoryMB: row.memory_mb,
    diskSizeMB: row.disk_size_mb,
    envdVersion: row.envd_version,
    spec: row.spec ?? null,
    nodeId: row.node_id,
    snapshotId: row.snapshot_id,
    layerSnapshotId: row.layer_snapshot_id,
    baseTemplateId: row.base_template_id,
    startCmd: row.start_cmd,
    readyCmd: row.ready_cmd,
    defaultUser: row.default_user,
    defaultWorkdir: row.default_workdir,
    envVars: row.env_vars ?? {},
    layerKeys: row.layer_keys ?? [],
    buildSandboxId: row.build_sandbox_id,
    tokenNonce: row.token_nonce,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    finishedAt: row.finished_at,
  };
}

const TEMPLATE_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

/** E2B-shaped template id: 20 characters of [a-z0-9]. */
export function newTemplateId(): string {
  const bytes = randomBytes(20);
  let id = "";
  for (let i = 0; i < 20; i++) id += TEMPLATE_ID_ALPHABET[(bytes[i] ?? 0) % TEMPLATE_ID_ALPHABET.length];
  return id;
}

export async function getTemplate(db: Queryable, id: string): Promise<TemplateRecord | undefined> {
  const result = await db.query("SELECT * FROM templates WHERE id = $1 AND deleted_at IS NULL", [id]);
  return result.rows[0] ? toTemplate(result.rows[0]) : undefined;
}

/** A live template by alias in one namespace: a team's (teamId) or the shipped ones (null). */
export async function templateByAlias(
  db: Queryable,
  teamId: string | null,
  alias: string,
): Promise<TemplateRecord | undefined> {
  const result = await db.query(
    `SELECT * FROM templates WHERE alias = $1 AND deleted_at IS NULL AND team_id IS NOT DISTINCT FROM $2`,
    [alias, teamId],
  );
  return result.rows[0] ? toTemplate(result.rows[0]) : undefined;
}

/** Every live template of a team's namespace, oldest first (E2B `GET /templates`). */
export async function listTeamTemplates(db: Queryable, teamId: string): Promise<TemplateRecord[]> {
  const result = await db.query(
    "SELECT * FROM templates WHERE team_id = $1 AND deleted_at IS NULL ORDER BY created_at, id",
    [teamId],
  );
  return result.rows.map(toTemplate);
}

export async function insertTemplate(
  db: Queryable,
  t: { id: string; teamId: string; alias: string; cpuCount: number; memoryMB: number; diskSizeMB: number },
  envdVersion: string,
): Promise<TemplateRecord> {
  const result = await db.query(
    `INSERT INTO templates (id, team_id, alias, public, cpu_count, memory_mb, disk_size_mb, envd_version)
     VALUES ($1, $2, $3, false, $4, $5, $6, $7) RETURNING *`,
    [t.id, t.teamId, t.alias, t.cpuCount, t.memoryMB, t.diskSizeMB, envdVersion],
  );
  return toTemplate(result.rows[0]);
}

export async function setTemplatePublic(db: Queryable, id: string, isPublic: boolean): Promise<void> {
  await db.query("UPDATE templates SET public = $2, updated_at = now() WHERE id = $1", [id, isPublic]);
}

/** Soft delete: the alias is free again; builds' snapshots are marked deleted (their files go with the sweep). */
export async function deleteTemplate(db: Queryable, id: string): Promise<string[]> {
  await db.query("UPDATE templates SET deleted_at = now(), updated_at = now() WHERE id = $1", [id]);
  await db.query(
    `UPDATE template_builds SET status = 'error', reason = '{"message":"the template was deleted"}', finished_at = now(),
       updated_at = now() WHERE template_id = $1 AND status IN ('waiting', 'building')`,
    [id],
  );
  const snapshots = await db.query<{ id: string }>(
    `UPDATE snapshots SET deleted_at = now() WHERE deleted_at IS NULL AND kind = 'template'
       AND id IN (SELECT snapshot_id FROM template_builds WHERE template_id = $1 AND snapshot_id IS NOT NULL)
     RETURNING id`,
    [id],
  );
  return snapshots.rows.map((r) => r.id);
}

export async function recordSpawn(db: Queryable, templateId: string): Promise<void> {
  await db.query(
    "UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at = now() WHERE id = $1 AND team_id IS NOT NULL",
    [templateId],
  );
}

export interface NewBuild {
  readonly id: string;
  readonly templateId: string;
  readonly teamId: string;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
}

/**
 * Records a `waiting` build, and fails older builds of the template that were never started (E2B: superseded by
 * a newer one).
 */
export async function insertBuild(db: Queryable, b: NewBuild): Promise<BuildRecord> {
  await db.query(
    `UPDATE template_builds SET status = 'error', finished_at = now(), updated_at = now(),
       reason = '{"message":"The build was canceled because it was superseded by a newer one."}'
     WHERE template_id = $1 AND status = 'waiting' AND spec IS NULL`,
    [b.templateId],
  );
  const result = await db.query(
    `INSERT INTO template_builds (id, template_id, team_id, status, cpu_count, memory_mb, disk_size_mb, envd_version)
     VALUES ($1, $2, $3, 'waiting', $4, $5, $6, $7) RETURNING *`,
    [b.id, b.templateId, b.teamId, b.cpuCount, b.memoryMB, b.diskSizeMB, b.envdVersion],
  );
  return toBuild(result.rows[0]);
}

export async function getBuild(db: Queryable, buildId: string): Promise<BuildRecord | undefined> {
  const result = await db.query("SELECT * FROM template_builds WHERE id = $1", [buildId]);
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
}

export async function lockBuild(db: Queryable, buildId: string): Promise<BuildRecord | undefined> {
  const result = await db.query("SELECT * FROM template_builds WHERE id = $1 FOR UPDATE", [buildId]);
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
}

/** Stores the trigger's body on a waiting build; false when it is not waiting (triggered already, or failed). */
export async function storeBuildSpec(db: Queryable, buildId: string, spec: Record<string, unknown>): Promise<boolean> {
  const result = await db.query(
    "UPDATE template_builds SET spec = $2, updated_at = now() WHERE id = $1 AND status = 'waiting' AND spec IS NULL",
    [buildId, JSON.stringify(spec)],
  );
  return (result.rowCount ?? 0) > 0;
}

/** Undoes storeBuildSpec when the master could not start the build: it can be triggered again. */
export async function clearBuildSpec(db: Queryable, buildId: string): Promise<void> {
  await db.query("UPDATE template_builds SET spec = NULL WHERE id = $1 AND status = 'waiting'", [buildId]);
}

export async function markBuildBuilding(db: Queryable, buildId: string, buildSandboxId: string, nonce: string) {
  const result = await db.query(
    `UPDATE template_builds SET status = 'building', build_sandbox_id = $2, token_nonce = $3, updated_at = now()
     WHERE id = $1 AND status = 'waiting' RETURNING *`,
    [buildId, buildSandboxId, nonce],
  );
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
}

/** The runner's heartbeat: a build whose row stops changing was abandoned (its master died). */
export async function touchBuild(db: Queryable, buildId: string): Promise<void> {
  await db.query("UPDATE template_builds SET updated_at = now() WHERE id = $1 AND status = 'building'", [buildId]);
}

export interface BuildResult {
  readonly nodeId: string;
  readonly snapshotId: string;
  readonly layerSnapshotId: string;
  readonly baseTemplateId: string;
  readonly startCmd: string | null;
  readonly readyCmd: string | null;
  readonly context: BuildContext;
  readonly layerKeys: readonly string[];
  readonly diskSizeMB: number;
}

/** Records a layer the running build made or reused, so a collection meanwhile never takes it. */
export async function addBuildLayerKey(db: Queryable, buildId: string, key: string): Promise<void> {
  await db.query(
    "UPDATE template_builds SET layer_keys = array_append(layer_keys, $2), updated_at = now() WHERE id = $1",
    [buildId, key],
  );
}

/** false when the build is no longer `building` (deleted or failed meanwhile). */
export async function markBuildReady(db: Queryable, buildId: string, r: BuildResult): Promise<boolean> {
  const result = await db.query(
    `UPDATE template_builds SET status = 'ready', node_id = $2, snapshot_id = $3, layer_snapshot_id = $4,
       base_template_id = $5, start_cmd = $6, ready_cmd = $7, default_user = $8, default_workdir = $9, env_vars = $10,
       layer_keys = ARRAY(SELECT DISTINCT unnest(layer_keys || $11::text[])), disk_size_mb = $12, finished_at = now(), updated_at = now()
     WHERE id = $1 AND status = 'building'`,
    [
      buildId,
      r.nodeId,
      r.snapshotId,
      r.layerSnapshotId,
      r.baseTemplateId,
      r.startCmd,
      r.readyCmd,
      r.context.user,
      r.context.workdir,
      JSON.stringify(r.context.env),
      r.layerKeys,
      r.diskSizeMB,
    ],
  );
  return (result.rowCount ?? 0) > 0;
}

export async function markBuildFailed(db: Queryable, buildId: string, reason: BuildReason): Promise<boolean> {
  const result = await db.query(
    `UPDATE template_builds SET status = 'error', reason = $2, finished_at = now(), updated_at = now()
     WHERE id = $1 AND status IN ('waiting', 'building')`,
    [buildId, JSON.stringify(reason)],
  );
  return (result.rowCount ?? 0) > 0;
}

/** Builds left `building` by a master that stopped (no heartbeat for `staleMs`): failed with that reason. */
export async function failAbandonedBuilds(db: Queryable, staleMs: number): Promise<BuildRecord[]> {
  const result = await db.query(
    `UPDATE template_builds SET status = 'error', finished_at = now(), updated_at = now(),
       reason = '{"message":"An internal error occurred: the build was interrupted (its master stopped). Please try again."}'
     WHERE status = 'building' AND updated_at < now() - make_interval(secs => $1) RETURNING *`,
    [staleMs / 1000],
  );
  return result.rows.map(toBuild);
}

export async function appendBuildLogs(
  db: Queryable,
  buildId: string,
  firstSeq: number,
  entries: readonly BuildLogEntry[],
): Promise<void> {
  if (entries.length === 0) return;
  const values: unknown[] = [buildId];
  const rows = entries.map((e, i) => {
    values.push(firstSeq + i, e.timestamp, e.level, e.message, e.step ?? null);
    const n = values.length;
    return `($1, $${n - 4}, $${n - 3}, $${n - 2}, $${n - 1}, $${n})`;
  });
  await db.query(
    `INSERT INTO template_build_logs (build_id, seq, ts, level, message, step) VALUES ${rows.join(", ")}`,
    values,
  );
}

const LEVELS = ["debug", "info", "warn", "error"] as const;

/** Log entries from `offset` (an index into the entries at or above `level`), at most `limit`. */
export async function readBuildLogs(
  db: Queryable,
  buildId: string,
  offset: number,
  limit: number,
  level?: BuildLogEntry["level"],
): Promise<BuildLogEntry[]> {
  const levels = level ? LEVELS.slice(LEVELS.indexOf(level)) : LEVELS;
  const result = await db.query(
    `SELECT ts, level, message, step FROM template_build_logs WHERE build_id = $1 AND level = ANY($2)
     ORDER BY seq OFFSET $3 LIMIT $4`,
    [buildId, levels, offset, limit],
  );
  return result.rows.map((r) => ({
    timestamp: r.ts,
    level: r.level,
    message: r.message,
    ...(r.step ? { step: r.step } : {}),
  }));
}

/** Builds of a template, newest first. */
export async function listBuilds(db: Queryable, templateId: string, limit = 100): Promise<BuildRecord[]> {
  const result = await db.query(
    "SELECT * FROM template_builds WHERE template_id = $1 ORDER BY created_at DESC LIMIT $2",
    [templateId, limit],
  );
  return result.rows.map(toBuild);
}

// Tags --------------------------------------------------------------------------------------------------------

export const DEFAULT_TAG = "default";

export async function assignTags(
  db: Queryable,
  templateId: string,
  buildId: string,
  tags: readonly string[],
): Promise<void> {
  for (const tag of tags) {
    await db.query("INSERT INTO template_tags (template_id, tag, build_id) VALUES ($1, $2, $3)", [
      templateId,
      tag,
      buildId,
    ]);
  }
}

export async function removeTags(db: Queryable, templateId: string, tags: readonly string[]): Promise<number> {
  const result = await db.query("DELETE FROM template_tags WHERE template_id = $1 AND tag = ANY($2)", [
    templateId,
    tags,
  ]);
  return result.rowCount ?? 0;
}

/** The build `tag` names: its newest assignment whose build is ready (a build id works as a tag too). */
export async function resolveTag(db: Queryable, templateId: string, tag: string): Promise<BuildRecord | undefined> {
  const result = await db.query(
    `SELECT b.* FROM template_builds b
     WHERE b.template_id = $1 AND b.status = 'ready' AND (
       b.id::text = $2 OR b.id IN (SELECT build_id FROM template_tags WHERE template_id = $1 AND tag = $2))
     ORDER BY (SELECT max(t.id) FROM template_tags t WHERE t.template_id = $1 AND t.tag = $2 AND t.build_id = b.id)
       DESC NULLS LAST, b.created_at DESC
     LIMIT 1`,
    [templateId, tag],
  );
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
}

/** Whether a build `tag` names is still waiting or building (a create for it may wait for it). */
export async function hasPendingBuild(db: Queryable, templateId: string, tag: string): Promise<boolean> {
  const result = await db.query(
    `SELECT 1 FROM template_builds b WHERE b.template_id = $1 AND b.status IN ('waiting', 'building')
       AND b.spec IS NOT NULL AND b.id IN (SELECT build_id FROM template_tags WHERE template_id = $1 AND tag = $2)`,
    [templateId, tag],
  );
  return (result.rowCount ?? 0) > 0;
}

/** Per tag, its newest assignment (whatever its build's status), ordered by tag. */
export async function listTags(
  db: Queryable,
  templateId: string,
): Promise<{ tag: string; buildId: string; createdAt: Date }[]> {
  const result = await db.query(
    `SELECT DISTINCT ON (tag) tag, build_id, created_at FROM template_tags WHERE template_id = $1
     ORDER BY tag, id DESC`,
    [templateId],
  );
  return result.rows.map((r) => ({ tag: r.tag, buildId: r.build_id, createdAt: r.created_at }));
}

/** Tags whose newest assignment is `buildId`. */
export async function tagsOfBuild(db: Queryable, templateId: string, buildId: string): Promise<string[]> {
  return (await listTags(db, templateId)).filter((t) => t.buildId === buildId).map((t) => t.tag);
}

// Uploaded COPY archives ---------------------------------------------------------------------------------------

export async function hasFiles(db: Queryable, teamId: string, hash: string): Promise<boolean> {
  const result = await db.query("SELECT 1 FROM template_files WHERE team_id = $1 AND hash = $2", [teamId, hash]);
  return (result.rowCount ?? 0) > 0;
}

export async function putFiles(db: Queryable, teamId: string, hash: string, data: Buffer): Promise<void> {
  await db.query(
    `INSERT INTO template_files (team_id, hash, size_bytes, data) VALUES ($1, $2, $3, $4)
     ON CONFLICT (team_id, hash) DO UPDATE SET size_bytes = $3, data = $4, created_at = now()`,
    [teamId, hash, data.length, data],
  );
}

export async function getFiles(db: Queryable, teamId: string, hash: string): Promise<Buffer | undefined> {
  const result = await db.query<{ data: Buffer }>("SELECT data FROM template_files WHERE team_id = $1 AND hash = $2", [
    teamId,
    hash,
  ]);
  return result.rows[0]?.data;
}

export async function insertUploadLink(
  db: Queryable,
  tokenHash: string,
  teamId: string,
  hash: string,
  ttlSeconds: number,
): Promise<void> {
  await db.query("DELETE FROM template_upload_links WHERE expires_at < now()");
  await db.query(
    `INSERT INTO template_upload_links (token_hash, team_id, hash, expires_at)
     VALUES ($1, $2, $3, now() + make_interval(secs => $4))`,
    [tokenHash, teamId, hash, ttlSeconds],
  );
}

/** Consumes an upload link: its team and hash when it exists and has not expired. */
export async function takeUploadLink(
  db: Queryable,
  tokenHash: string,
): Promise<{ teamId: string; hash: string } | undefined> {
  const result = await db.query(
    "DELETE FROM template_upload_links WHERE token_hash = $1 RETURNING team_id, hash, expires_at > now() AS valid",
    [tokenHash],
  );
  const row = result.rows[0];
  return row?.valid ? { teamId: row.team_id, hash: row.hash } : undefined;
}

// Cached step layers -------------------------------------------------------------------------------------------

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
