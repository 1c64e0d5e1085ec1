import { createHash, randomBytes, randomUUID } from "node:crypto";
import type { Queryable } from "./db.js";

/** E2B's rule for a volume name (case kept). */
export const VOLUME_NAME = /^[a-zA-Z0-9_-]{1,63}$/;

/** A team's persistent folder (E2B volume). */
export interface VolumeRow {
  readonly id: string;
  readonly teamId: string;
  readonly name: string;
  readonly quotaBytes: number;
  readonly createdAt: Date;
}

interface RawVolume {
  id: string;
  team_id: string;
  name: string;
  quota_bytes: string;
  created_at: Date;
}

const toVolume = (row: RawVolume): VolumeRow => ({
  id: row.id,
  teamId: row.team_id,
  name: row.name,
  quotaBytes: Number(row.quota_bytes),
  createdAt: row.created_at,
});

/** Creates a volume; undefined when the team has one of that name already. */
export async function insertVolume(
  db: Queryable,
  teamId: string,
  name: string,
  quotaBytes: number,
): Promise<VolumeRow | undefined> {
  const result = await db.query<RawVolume>(
    `INSERT INTO volumes (id, team_id, name, quota_bytes) VALUES ($1, $2, $3, $4)
     ON CONFLICT (team_id, name) DO NOTHING RETURNING *`,
    [randomUUID(), teamId, name, quotaBytes],
  );
  return result.rows[0] ? toVolume(result.rows[0]) : undefined;
}

export async function listVolumes(db: Queryable, teamId: string): Promise<VolumeRow[]> {
  const result = await db.query<RawVolume>("SELECT * FROM volumes WHERE team_id = $1 ORDER BY created_at, id", [
    teamId,
  ]);
  return result.rows.map(toVolume);
}

/** The team's volume with this id; another team's is not found. */
export async function findVolume(db: Queryable, teamId: string, id: string): Promise<VolumeRow | undefined> {
  const result = await db.query<RawVolume>("SELECT * FROM volumes WHERE id = $1 AND team_id = $2", [id, teamId]);
  return result.rows[0] ? toVolume(result.rows[0]) : undefined;
}

/** The team's volumes by name (what a create's `volumeMounts` name). */
export async function volumesByName(
  db: Queryable,
  teamId: string,
  names: readonly string[],
): Promise<Map<string, VolumeRow>> {
  if (names.length === 0) return new Map();
  const result = await db.query<RawVolume>("SELECT * FROM volumes WHERE team_id = $1 AND name = ANY($2)", [
    teamId,
    [...names],
  ]);
  return new Map(result.rows.map((row) => [row.name, toVolume(row)]));
}

/** Deletes the row (and its tokens); true when there was one. */
export async function deleteVolume(db: Queryable, teamId: string, id: string): Promise<boolean> {
  const result = await db.query("DELETE FROM volumes WHERE id = $1 AND team_id = $2", [id, teamId]);
  return (result.rowCount ?? 0) > 0;
}

const hashToken = (token: string) => createHash("sha256").update(token).digest("hex");

/** A fresh content-API token for one volume of one team (E2B hands one out at every create, info and connect). */
export async function issueVolumeToken(db: Queryable, volume: VolumeRow, ttlMs: number): Promise<string> {
  await db.query("DELETE FROM volume_tokens WHERE expires_at < now()");
  const token = `wvt_${randomBytes(24).toString("base64url")}`;
  await db.query(
    `INSERT INTO volume_tokens (token_hash, volume_id, team_id, expires_at)
     VALUES ($1, $2, $3, now() + make_interval(secs => $4))`,
    [hashToken(token), volume.id, volume.teamId, ttlMs / 1000],
  );
  return token;
}

/** The volume a token opens, if the token is valid for it. */
export async function volumeForToken(db: Queryable, volumeId: string, token: string): Promise<VolumeRow | undefined> {
  const result = await db.query<RawVolume>(
    `SELECT v.* FROM volume_tokens t JOIN volumes v ON v.id = t.volume_id AND v.team_id = t.team_id
     WHERE t.token_hash = $1 AND t.volume_id = $2 AND t.expires_at > now()`,
    [hashToken(token), volumeId],
  );
  return result.rows[0] ? toVolume(result.rows[0]) : undefined;
}
