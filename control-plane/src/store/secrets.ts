import { createHash, randomBytes } from "node:crypto";
import { decodeTimeCursor, encodeTimeCursor } from "./cursor.js";
import type { Db, Queryable } from "./db.js";
import { withTransaction } from "./db.js";
import type { SecretKeyRing } from "./secret-box.js";

/** A secret's metadata as E2B's API shows it; the value never leaves this module except through `redeemGrant`. */
export interface SecretInfo {
  readonly id: string;
  readonly teamId: string;
  readonly name: string;
  readonly version: number;
  readonly metadata: Record<string, string>;
  readonly createdAt: Date;
  readonly updatedAt: Date;
}

export interface SecretPage {
  readonly secrets: SecretInfo[];
  readonly nextToken: string | undefined;
}

/** A redeemed grant: env var name → the secret's value, for one process start. */
export interface RedeemedGrant {
  readonly teamId: string;
  readonly env: Record<string, string>;
}

export class SecretConflictError extends Error {
  constructor(readonly secretName: string) {
    super(`a secret named '${secretName}' already exists`);
    this.name = "SecretConflictError";
  }
}

const ID_PREFIX = "sec_";
const GRANT_PREFIX = "wsg_";

function toInfo(row: Record<string, unknown>): SecretInfo {
  return {
    id: row.id as string,
    teamId: row.team_id as string,
    name: row.name as string,
    version: Number(row.current_version),
    metadata: (row.metadata as Record<string, string>) ?? {},
    createdAt: row.created_at as Date,
    updatedAt: row.updated_at as Date,
  };
}

// The row a ciphertext is bound to: moved into another team's or secret's row it does not open.
const sealContext = (teamId: string, secretId: string) => `warren-secret:${teamId}:${secretId}`;

const INFO_COLUMNS = "id, team_id, name, current_version, metadata, created_at, updated_at";

/** Secrets are selected by id (`sec_…`) or by (lower-cased) name, as E2B's `secretID` path parameter allows. */
function selector(ref: string): { column: "id" | "name"; value: string } {
  return ref.startsWith(ID_PREFIX) ? { column: "id", value: ref } : { column: "name", value: ref.toLowerCase() };
}

export async function createSecret(
  db: Queryable,
  ring: SecretKeyRing,
  input: { teamId: string; name: string; value: string; metadata: Record<string, string> },
): Promise<SecretInfo> {
  const id = `${ID_PREFIX}${randomBytes(12).toString("hex")}`;
  const sealed = ring.seal(input.value, sealContext(input.teamId, id));
  const result = await db.query(
    `INSERT INTO secrets (id, team_id, name, metadata, key_id, ciphertext)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (team_id, name) DO NOTHING
     RETURNING ${INFO_COLUMNS}`,
    [id, input.teamId, input.name, JSON.stringify(input.metadata), sealed.keyId, sealed.blob],
  );
  if (!result.rows[0]) throw new SecretConflictError(input.name);
  return toInfo(result.rows[0]);
}

/** A new version of the value (and the metadata when given); undefined when the team has no such secret. */
export async function updateSecret(
  db: Queryable,
  ring: SecretKeyRing,
  input: { teamId: string; ref: string; value: string; metadata: Record<string, string> | undefined },
): Promise<SecretInfo | undefined> {
  const found = await getSecret(db, input.teamId, input.ref);
  if (!found) return undefined;
  const sealed = ring.seal(input.value, sealContext(input.teamId, found.id));
  const result = await db.query(
    `UPDATE secrets SET current_version = current_version + 1, key_id = $3, ciphertext = $4,
       metadata = COALESCE($5::jsonb, metadata), updated_at = now()
     WHERE id = $1 AND team_id = $2
     RETURNING ${INFO_COLUMNS}`,
    [
      found.id,
      input.teamId,
      sealed.keyId,
      sealed.blob,
      input.metadata === undefined ? null : JSON.stringify(input.metadata),
    ],
  );
  return result.rows[0] ? toInfo(result.rows[0]) : undefined;
}

export async function getSecret(db: Queryable, teamId: string, ref: string): Promise<SecretInfo | undefined> {
  const { column, value } = selector(ref);
  const result = await db.query(`SELECT ${INFO_COLUMNS} FROM secrets WHERE team_id = $1 AND ${column} = $2`, [
    teamId,
    value,
  ]);
  return result.rows[0] ? toInfo(result.rows[0]) : undefined;
}

export async function deleteSecret(db: Queryable, teamId: string, ref: string): Promise<boolean> {
  const { column, value } = selector(ref);
  const result = await db.query(`DELETE FROM secrets WHERE team_id = $1 AND ${column} = $2`, [teamId, value]);
  return (result.rowCount ?? 0) > 0;
}

/** Newest first; `nextToken` continues after the last row of the previous page. Undefined: a token not ours. */
export async function listSecrets(
  db: Queryable,
  teamId: string,
  limit: number,
  nextToken: string | undefined,
): Promise<SecretPage | undefined> {
  const params: unknown[] = [teamId, limit + 1];
  let after = "";
  if (nextToken !== undefined) {
    const cursor = decodeTimeCursor(nextToken);
    if (!cursor) return undefined;
    params.push(cursor.at, cursor.id);
    after = "AND (created_at, id) < ($3, $4)";
  }
  const result = await db.query(
    `SELECT ${INFO_COLUMNS} FROM secrets WHERE team_id = $1 ${after} ORDER BY created_at DESC, id DESC LIMIT $2`,
    params,
  );
  const rows = result.rows.slice(0, limit).map(toInfo);
  const last = rows[rows.length - 1];
  return {
    secrets: rows,
    nextToken: result.rows.length > limit && last ? encodeTimeCursor(last.createdAt, last.id) : undefined,
  };
}

const grantHash = (grant: string) => createHash("sha256").update(grant).digest("hex");

/**
 * A one-time grant for one process start in one sandbox: env var name → secret. The grant string is returned once;
 * only its hash is stored. Fails with the first secret name the team does not have.
 */
export async function createGrant(
  db: Queryable,
  input: { teamId: string; sandboxId: string; env: Record<string, string>; ttlMs: number },
): Promise<{ grant: string; expiresAt: Date } | { missing: string }> {
  const ids: Record<string, string> = {};
  for (const [envName, ref] of Object.entries(input.env)) {
    const secret = await getSecret(db, input.teamId, ref);
    if (!secret) return { missing: ref };
    ids[envName] = secret.id;
  }
  const grant = `${GRANT_PREFIX}${randomBytes(24).toString("base64url")}`;
  const result = await db.query<{ expires_at: Date }>(
    `INSERT INTO secret_grants (grant_hash, team_id, sandbox_id, env, expires_at)
     VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::double precision / 1000))
     RETURNING expires_at`,
    [grantHash(grant), input.teamId, input.sandboxId, JSON.stringify(ids), input.ttlMs],
  );
  return { grant, expiresAt: (result.rows[0] as { expires_at: Date }).expires_at };
}

/**
 * Uses a grant up (once, for the sandbox it names, before it expires) and opens its secrets. Undefined when the grant
 * is unknown, used, expired or for another sandbox — the caller cannot tell which, so guessing learns nothing. A
 * secret deleted since the grant was made is left out.
 */
export async function redeemGrant(
  db: Db,
  ring: SecretKeyRing,
  grant: string,
  sandboxId: string,
): Promise<RedeemedGrant | undefined> {
  return withTransaction(db, async (tx) => {
    const used = await tx.query<{ team_id: string; env: Record<string, string> }>(
      `UPDATE secret_grants SET used_at = now()
       WHERE grant_hash = $1 AND sandbox_id = $2 AND used_at IS NULL AND expires_at > now()
       RETURNING team_id, env`,
      [grantHash(grant), sandboxId],
    );
    const row = used.rows[0];
    if (!row) return undefined;
    const ids = Object.values(row.env);
    const sealed = await tx.query<{ id: string; key_id: string; ciphertext: Buffer }>(
      "SELECT id, key_id, ciphertext FROM secrets WHERE team_id = $1 AND id = ANY($2::text[])",
      [row.team_id, ids],
    );
    const values = new Map(
      sealed.rows.map((s) => [
        s.id,
        ring.open({ keyId: s.key_id, blob: s.ciphertext }, sealContext(row.team_id, s.id)),
      ]),
    );
    const env: Record<string, string> = {};
    for (const [envName, id] of Object.entries(row.env)) {
      const value = values.get(id);
      if (value !== undefined) env[envName] = value;
    }
    // Used and expired grants have no further use; keep the table small.
    await tx.query("DELETE FROM secret_grants WHERE expires_at < now() - interval '1 hour'");
    return { teamId: row.team_id, env };
  });
}

/** Re-seals every secret not sealed with the newest key (key rotation); returns how many rows moved. */
export async function rewrapSecrets(db: Db, ring: SecretKeyRing): Promise<number> {
  const stale = await db.query<{ id: string; team_id: string; key_id: string; ciphertext: Buffer }>(
    "SELECT id, team_id, key_id, ciphertext FROM secrets WHERE key_id <> $1",
    [ring.currentKeyId],
  );
  let moved = 0;
  for (const row of stale.rows) {
    const context = sealContext(row.team_id, row.id);
    const sealed = ring.seal(ring.open({ keyId: row.key_id, blob: row.ciphertext }, context), context);
    const result = await db.query(
      "UPDATE secrets SET key_id = $2, ciphertext = $3 WHERE id = $1 AND key_id = $4 AND ciphertext = $5",
      [row.id, sealed.keyId, sealed.blob, row.key_id, row.ciphertext],
    );
    moved += result.rowCount ?? 0;
  }
  return moved;
}
