import { randomBytes } from "node:crypto";
import type { Queryable } from "./db.js";

export type ArtifactFormat = "tar" | "zip";

/** A published artifact: what was frozen, from where, and the digest of the stored bytes. */
export interface ArtifactRow {
  readonly id: string;
  readonly teamId: string;
  readonly sandboxId: string;
  readonly path: string;
  readonly format: ArtifactFormat;
  readonly sizeBytes: number;
  /** Hex sha256 of the stored archive; also its blob's name. */
  readonly sha256: string;
  readonly createdAt: Date;
}

/** Per team: the most artifacts and bytes kept; the oldest go first when a publish passes either. */
export interface RetentionLimit {
  readonly maxCount: number;
  readonly maxBytes: number;
}

const COLUMNS = "id, team_id, sandbox_id, path, format, size_bytes, sha256, created_at";
const ID_PREFIX = "art_";
const ID = /^art_[0-9a-f]{24}$/;

export function newArtifactId(): string {
  return `${ID_PREFIX}${randomBytes(12).toString("hex")}`;
}

/** Whether `value` can be an artifact id at all (anything else is a 404 without a query). */
export function isArtifactId(value: string): boolean {
  return ID.test(value);
}

function toRow(row: Record<string, unknown>): ArtifactRow {
  return {
    id: row.id as string,
    teamId: row.team_id as string,
    sandboxId: row.sandbox_id as string,
    path: row.path as string,
    format: row.format as ArtifactFormat,
    sizeBytes: Number(row.size_bytes),
    sha256: row.sha256 as string,
    createdAt: row.created_at as Date,
  };
}

/**
 * Serializes everything that creates or removes the blob of one digest (a publish renaming it into place, a delete
 * removing the last reference), so a blob is never unlinked under a row that was just written for it.
 */
export async function lockDigest(tx: Queryable, sha256: string): Promise<void> {
  await tx.query("SELECT pg_advisory_xact_lock(hashtext('warren-artifact'), hashtext($1))", [sha256]);
}

export async function insertArtifact(tx: Queryable, row: Omit<ArtifactRow, "createdAt">): Promise<ArtifactRow> {
  const result = await tx.query(
    `INSERT INTO artifacts (id, team_id, sandbox_id, path, format, size_bytes, sha256)
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING ${COLUMNS}`,
    [row.id, row.teamId, row.sandboxId, row.path, row.format, row.sizeBytes, row.sha256],
  );
  return toRow(result.rows[0]);
}

/** The team's artifacts (of one sandbox when given), newest first. */
export async function listArtifacts(
  db: Queryable,
  teamId: string,
  sandboxId: string | undefined,
  limit: number,
): Promise<ArtifactRow[]> {
  const result = sandboxId
    ? await db.query(
        `SELECT ${COLUMNS} FROM artifacts WHERE team_id = $1 AND sandbox_id = $2
         ORDER BY created_at DESC, id DESC LIMIT $3`,
        [teamId, sandboxId, limit],
      )
    : await db.query(`SELECT ${COLUMNS} FROM artifacts WHERE team_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2`, [
        teamId,
        limit,
      ]);
  return result.rows.map(toRow);
}

/** One artifact; with a team, only that team's (another team's is undefined, as a missing one). */
export async function getArtifact(db: Queryable, id: string, teamId?: string): Promise<ArtifactRow | undefined> {
  if (!isArtifactId(id)) return undefined;
  const result =
    teamId === undefined
      ? await db.query(`SELECT ${COLUMNS} FROM artifacts WHERE id = $1`, [id])
      : await db.query(`SELECT ${COLUMNS} FROM artifacts WHERE id = $1 AND team_id = $2`, [id, teamId]);
  return result.rows[0] ? toRow(result.rows[0]) : undefined;
}

export async function deleteArtifact(tx: Queryable, id: string, teamId: string): Promise<ArtifactRow | undefined> {
  if (!isArtifactId(id)) return undefined;
  const result = await tx.query(`DELETE FROM artifacts WHERE id = $1 AND team_id = $2 RETURNING ${COLUMNS}`, [
    id,
    teamId,
  ]);
  return result.rows[0] ? toRow(result.rows[0]) : undefined;
}

/**
 * Deletes the team's oldest artifacts until it keeps at most `maxCount` and `maxBytes` (never `keepId`, the one
 * just published); returns the rows removed, whose blobs the caller releases.
 */
export async function evictOverRetention(
  tx: Queryable,
  teamId: string,
  limit: RetentionLimit,
  keepId: string,
): Promise<ArtifactRow[]> {
  const result = await tx.query(
    `WITH ranked AS (
       SELECT id,
              row_number() OVER newest_first AS n,
              sum(size_bytes) OVER newest_first AS bytes
       FROM artifacts WHERE team_id = $1
       WINDOW newest_first AS (ORDER BY (id = $4) DESC, created_at DESC, id DESC)
     )
     DELETE FROM artifacts a USING ranked r
     WHERE a.id = r.id AND a.id <> $4 AND (r.n > $2 OR r.bytes > $3)
     RETURNING ${COLUMNS.split(", ")
       .map((c) => `a.${c}`)
       .join(", ")}`,
    [teamId, limit.maxCount, limit.maxBytes, keepId],
  );
  return result.rows.map(toRow);
}

export async function digestInUse(tx: Queryable, sha256: string): Promise<boolean> {
  const result = await tx.query("SELECT 1 FROM artifacts WHERE sha256 = $1 LIMIT 1", [sha256]);
  return result.rows.length > 0;
}
