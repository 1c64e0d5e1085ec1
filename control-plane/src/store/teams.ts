import { createHash, randomBytes } from "node:crypto";
import type { TeamEgressMode } from "../runtime/egress/policy.js";
import type { Queryable } from "./db.js";

export interface Team {
  readonly id: string;
  readonly name: string;
  readonly maxConcurrentSandboxes: number;
  readonly maxLengthHours: number;
  readonly maxCreatesPerMinute: number;
  /** What its sandboxes may reach outside (runtime/egress/policy.ts TeamEgressMode). */
  readonly egressMode: TeamEgressMode;
}

export interface TeamLimits {
  readonly maxConcurrentSandboxes?: number;
  readonly maxLengthHours?: number;
  readonly maxCreatesPerMinute?: number;
  readonly egressMode?: TeamEgressMode;
}

export interface CreatedApiKey {
  readonly id: string;
  readonly teamId: string;
  /** The key itself: returned once, never stored. */
  readonly key: string;
  readonly prefix: string;
}

interface TeamRow {
  id: string;
  name: string;
  max_concurrent_sandboxes: number;
  max_length_hours: number;
  max_creates_per_minute: number;
  egress_mode: TeamEgressMode;
}

function toTeam(row: TeamRow): Team {
  return {
    id: row.id,
    name: row.name,
    maxConcurrentSandboxes: row.max_concurrent_sandboxes,
    maxLengthHours: row.max_length_hours,
    maxCreatesPerMinute: row.max_creates_per_minute,
    egressMode: row.egress_mode,
  };
}

/** API keys are 160 random bits: SHA-256 is enough to store them (no dictionary to guard against). */
export function hashApiKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

export async function createTeam(db: Queryable, name: string, limits: TeamLimits = {}): Promise<Team> {
  const id = `team_${randomBytes(8).toString("hex")}`;
  const result = await db.query<TeamRow>(
    `INSERT INTO teams (id, name, max_concurrent_sandboxes, max_length_hours, max_creates_per_minute, egress_mode)
     VALUES ($1, $2, COALESCE($3, 100), COALESCE($4, 24), COALESCE($5, 600), COALESCE($6, 'open')) RETURNING *`,
    [
      id,
      name,
      limits.maxConcurrentSandboxes ?? null,
      limits.maxLengthHours ?? null,
      limits.maxCreatesPerMinute ?? null,
      limits.egressMode ?? null,
    ],
  );
  return toTeam(result.rows[0] as TeamRow);
}

/** Changes a team's limits (fields left out keep their value); undefined for an unknown team. */
export async function updateTeam(db: Queryable, teamId: string, limits: TeamLimits): Promise<Team | undefined> {
  const result = await db.query<TeamRow>(
    `UPDATE teams SET max_concurrent_sandboxes = COALESCE($2, max_concurrent_sandboxes),
       max_length_hours = COALESCE($3, max_length_hours),
       max_creates_per_minute = COALESCE($4, max_creates_per_minute),
       egress_mode = COALESCE($5, egress_mode)
     WHERE id = $1 RETURNING *`,
    [
      teamId,
      limits.maxConcurrentSandboxes ?? null,
      limits.maxLengthHours ?? null,
      limits.maxCreatesPerMinute ?? null,
      limits.egressMode ?? null,
    ],
  );
  return result.rows[0] ? toTeam(result.rows[0]) : undefined;
}

export async function getTeam(db: Queryable, teamId: string): Promise<Team | undefined> {
  const result = await db.query<TeamRow>("SELECT * FROM teams WHERE id = $1", [teamId]);
  return result.rows[0] ? toTeam(result.rows[0]) : undefined;
}

/**
 * The team that owns the builds of Warren's shipped templates (master/templates/shipped-builds.ts): builds, their
 * layers and snapshots belong to a team, and these belong to none of the users'. Reserved: no team list shows it
 * and the admin API neither changes it nor makes it a key, so nobody acts as it.
 */
export const SHIPPED_BUILDS_TEAM = "warren";

/** The users' teams (never SHIPPED_BUILDS_TEAM). */
export async function listTeams(db: Queryable): Promise<Team[]> {
  const result = await db.query<TeamRow>("SELECT * FROM teams WHERE id <> $1 ORDER BY created_at", [
    SHIPPED_BUILDS_TEAM,
  ]);
  return result.rows.map(toTeam);
}

/** `approver`: the key may change the team's exec policy and approve or reject its reviews. */
export async function createApiKey(db: Queryable, teamId: string, name = "", approver = false): Promise<CreatedApiKey> {
  const key = `e2b_${randomBytes(20).toString("hex")}`;
  const id = `key_${randomBytes(8).toString("hex")}`;
  const prefix = key.slice(0, 10);
  await db.query(
    "INSERT INTO api_keys (id, team_id, key_hash, key_prefix, name, approver) VALUES ($1, $2, $3, $4, $5, $6)",
    [id, teamId, hashApiKey(key), prefix, name, approver],
  );
  return { id, teamId, key, prefix };
}

/** Who a request's API key is: its team, the key's id and whether it is an approver. */
export interface ApiKeyIdentity {
  readonly team: Team;
  readonly keyId: string;
  readonly approver: boolean;
}

/** The identity of an API key, or undefined for an unknown or revoked key. */
export function identifyApiKey(db: Queryable, key: string): Promise<ApiKeyIdentity | undefined> {
  return identifyApiKeyHash(db, hashApiKey(key));
}

/** identifyApiKey for a key already hashed (hashApiKey). */
export async function identifyApiKeyHash(db: Queryable, keyHash: string): Promise<ApiKeyIdentity | undefined> {
  const result = await db.query<TeamRow & { key_id: string; key_approver: boolean }>(
    `SELECT t.*, k.id AS key_id, k.approver AS key_approver FROM api_keys k JOIN teams t ON t.id = k.team_id
     WHERE k.key_hash = $1 AND k.revoked_at IS NULL`,
    [keyHash],
  );
  const row = result.rows[0];
  return row ? { team: toTeam(row), keyId: row.key_id, approver: row.key_approver } : undefined;
}

export async function revokeApiKey(db: Queryable, keyId: string): Promise<boolean> {
  const result = await db.query("UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL", [keyId]);
  return (result.rowCount ?? 0) > 0;
}

/** An API key as the admin listing shows it: never the key or its hash. */
export interface ApiKeyInfo {
  readonly id: string;
  readonly name: string;
  /** The key's first characters (`e2b_…`), to tell keys apart. */
  readonly prefix: string;
  readonly createdAt: Date;
  readonly revokedAt: Date | null;
  /** May change the team's exec policy and approve or reject its reviews. */
  readonly approver: boolean;
}

/** A team's API keys, revoked ones included, oldest first. */
export async function listApiKeys(db: Queryable, teamId: string): Promise<ApiKeyInfo[]> {
  const result = await db.query<{
    id: string;
    name: string;
    key_prefix: string;
    created_at: Date;
    revoked_at: Date | null;
    approver: boolean;
  }>(
    `SELECT id, name, key_prefix, created_at, revoked_at, approver FROM api_keys
     WHERE team_id = $1 ORDER BY created_at, id`,
    [teamId],
  );
  return result.rows.map((row) => ({
    id: row.id,
    name: row.name,
    prefix: row.key_prefix,
    createdAt: row.created_at,
    revokedAt: row.revoked_at,
    approver: row.approver,
  }));
}
