import { randomBytes } from "node:crypto";
import type { Queryable } from "./db.js";
import { masterGoneSql } from "./master-liveness.js";

/**
 * Templates, their builds and build logs (E2B's template API, `shared/E2B-TEMPLATES.md`; tags, uploaded COPY
 * archives and cached step layers are in template-tags.ts, template-files.ts and template-layers.ts). A template with `teamId` null ships with Warren (the null namespace: public to every
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
  /** How often another master continued this build after its master stopped. */
  readonly takeovers: number;
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
    takeovers: row.takeovers ?? 0,
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

/** The team's live template of that alias, else Warren's shipped one: one round trip for a create's lookup. */
export async function ownOrShippedByAlias(
  db: Queryable,
  teamId: string,
  alias: string,
): Promise<TemplateRecord | undefined> {
  const result = await db.query(
    `SELECT * FROM templates WHERE alias = $1 AND deleted_at IS NULL AND (team_id = $2 OR team_id IS NULL)
     ORDER BY team_id IS NULL LIMIT 1`,
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

/** The envd version every built template reports (Warren's envd, envd/src/version.ts). */
export const BUILD_ENVD_VERSION = "0.6.4";

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

export async function markBuildBuilding(
  db: Queryable,
  buildId: string,
  buildSandboxId: string,
  nonce: string,
  masterLock: number | null = null,
) {
  const result = await db.query(
    `UPDATE template_builds SET status = 'building', build_sandbox_id = $2, token_nonce = $3, master_lock = $4,
       updated_at = now()
     WHERE id = $1 AND status = 'waiting' RETURNING *`,
    [buildId, buildSandboxId, nonce, masterLock],
  );
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
}

/**
 * The runner's heartbeat: a build whose row stops changing was abandoned (its master died). False when the build
 * is no longer this run's (it ended, or another master took it over: its nonce changed).
 */
export async function touchBuild(db: Queryable, buildId: string, nonce: string): Promise<boolean> {
  const result = await db.query(
    "UPDATE template_builds SET updated_at = now() WHERE id = $1 AND status = 'building' AND token_nonce = $2",
    [buildId, nonce],
  );
  return (result.rowCount ?? 0) > 0;
}

/** A stopping master hands its build over: stale at once, so the leader's next pass gives it to a master. */
export async function handOffBuild(db: Queryable, buildId: string, nonce: string): Promise<boolean> {
  const result = await db.query(
    `UPDATE template_builds SET updated_at = 'epoch', slot_node_id = NULL, slot_waiting_since = NULL,
       slot_candidates = NULL
     WHERE id = $1 AND status = 'building' AND token_nonce = $2`,
    [buildId, nonce],
  );
  return (result.rowCount ?? 0) > 0;
}

/**
 * A build row whose run is over without an end (`$1`: the heartbeat's timeout in seconds): its master handed it off,
 * died (no session holds its liveness lock: known at once), or stopped heartbeating (a master cut off from
 * PostgreSQL, or one from before the lock existed).
 */
const ABANDONED = `status = 'building' AND (updated_at < now() - make_interval(secs => $1) OR ${masterGoneSql("master_lock")})`;

/** Builds left `building` by a master that stopped (no heartbeat for `staleMs`, died, or handed off). */
export async function abandonedBuilds(db: Queryable, staleMs: number): Promise<BuildRecord[]> {
  const result = await db.query(`SELECT * FROM template_builds WHERE ${ABANDONED}`, [staleMs / 1000]);
  return result.rows.map(toBuild);
}

/**
 * Gives an abandoned build to this master: a new build sandbox id and nonce (the old run, should it still be alive,
 * can no longer heartbeat, finish or fail it). Undefined when it is no longer abandoned (another master took it).
 */
export async function takeOverBuild(
  db: Queryable,
  buildId: string,
  staleMs: number,
  buildSandboxId: string,
  nonce: string,
  masterLock: number | null = null,
): Promise<BuildRecord | undefined> {
  const result = await db.query(
    `UPDATE template_builds SET takeovers = takeovers + 1, build_sandbox_id = $3, token_nonce = $4,
       master_lock = $5, updated_at = now(), slot_node_id = NULL, slot_waiting_since = NULL, slot_candidates = NULL
     WHERE id = $2 AND ${ABANDONED} RETURNING *`,
    [staleMs / 1000, buildId, buildSandboxId, nonce, masterLock],
  );
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
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
/** The build's result, when the build is still this run's (`nonce`). */
export async function markBuildReady(db: Queryable, buildId: string, r: BuildResult, nonce: string): Promise<boolean> {
  const result = await db.query(
    `UPDATE template_builds SET status = 'ready', node_id = $2, snapshot_id = $3, layer_snapshot_id = $4,
       base_template_id = $5, start_cmd = $6, ready_cmd = $7, default_user = $8, default_workdir = $9, env_vars = $10,
       layer_keys = ARRAY(SELECT DISTINCT unnest(layer_keys || $11::text[])), disk_size_mb = $12, finished_at = now(), updated_at = now()
     WHERE id = $1 AND status = 'building' AND token_nonce = $13`,
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
      nonce,
    ],
  );
  return (result.rowCount ?? 0) > 0;
}

/** Fails a build; with `nonce`, only while it is still that run's (another master may have taken it over). */
export async function markBuildFailed(
  db: Queryable,
  buildId: string,
  reason: BuildReason,
  nonce?: string,
): Promise<boolean> {
  const result = await db.query(
    `UPDATE template_builds SET status = 'error', reason = $2, finished_at = now(), updated_at = now()
     WHERE id = $1 AND status IN ('waiting', 'building') AND ($3::text IS NULL OR token_nonce = $3)`,
    [buildId, JSON.stringify(reason), nonce ?? null],
  );
  return (result.rowCount ?? 0) > 0;
}

/** An abandoned build no master can continue, failed with `message`; false when it is no longer abandoned. */
export async function failAbandonedBuild(
  db: Queryable,
  buildId: string,
  staleMs: number,
  message: string,
): Promise<boolean> {
  const result = await db.query(
    `UPDATE template_builds SET status = 'error', finished_at = now(), updated_at = now(), reason = $3
     WHERE id = $2 AND ${ABANDONED}`,
    [staleMs / 1000, buildId, JSON.stringify({ message })],
  );
  return (result.rowCount ?? 0) > 0;
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
