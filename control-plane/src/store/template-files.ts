import type { Queryable } from "./db.js";

/** Uploaded COPY archives (by team and E2B's files hash) and the one-time signed links they are uploaded with. */

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
