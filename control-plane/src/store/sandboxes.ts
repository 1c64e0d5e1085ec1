import type { EgressPolicy } from "../runtime/egress/policy.js";
import { decodeTimeCursor, encodeTimeCursor } from "./cursor.js";
import type { Queryable } from "./db.js";
import { LEDGER_LOCK } from "./events.js";

export type SandboxState = "starting" | "running" | "pausing" | "paused" | "resuming" | "killed" | "failed";
export const LIVE_STATES: readonly SandboxState[] = ["starting", "running", "pausing", "paused", "resuming"];

export interface SandboxRow {
  readonly id: string;
  readonly teamId: string;
  /** The node template it runs on (`base`, `code-interpreter-v1`, …). */
  readonly templateId: string;
  readonly alias: string | null;
  /** Started from a team's custom template: that template (shown as the sandbox's templateID) and its build. */
  readonly sourceTemplateId: string | null;
  readonly buildId: string | null;
  readonly state: SandboxState;
  readonly nodeId: string | null;
  readonly execId: string | null;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
  readonly tokenNonce: string;
  readonly envdTokenHash: string;
  readonly trafficTokenHash: string | null;
  readonly metadata: Record<string, string>;
  readonly envVars: Record<string, string>;
  readonly network: Record<string, unknown> | null;
  readonly allowInternetAccess: boolean | null;
  /** The policy the node enforces (request + team mode, runtime/egress/policy.ts effectiveEgress). */
  readonly egress: EgressPolicy | null;
  readonly volumeMounts: unknown[];
  /** The published snapshot of its last pause (the node holding it may go): see master/durability.ts. */
  readonly durableSnapshotId: string | null;
  /** The MCP servers the create named (E2B's `mcp` keys); the SDK starts the gateway. */
  readonly mcpServers: string[];
  readonly autoPause: boolean;
  readonly autoPauseMemory: boolean;
  readonly autoResume: boolean;
  readonly idempotencyKey: string | null;
  readonly requestHash: string | null;
  readonly createdAt: Date;
  readonly startedAt: Date;
  readonly endAt: Date;
  readonly pausedAt: Date | null;
  readonly endedAt: Date | null;
  readonly endReason: string | null;
}

// biome-ignore lint/suspicious/noExplicitAny: raw pg row
export function toSandboxRow(row: any): SandboxRow {
  return {
    id: row.id,
    teamId: row.team_id,
    templateId: row.template_id,
    alias: row.alias,
    sourceTemplateId: row.source_template_id ?? null,
    buildId: row.build_id ?? null,
    state: row.state,
    nodeId: row.node_id,
    execId: row.exec_id,
    cpuCount: row.cpu_count,
    memoryMB: row.memory_mb,
    diskSizeMB: row.disk_size_mb,
    envdVersion: row.envd_version,
    tokenNonce: row.token_nonce,
    envdTokenHash: row.envd_token_hash,
    trafficTokenHash: row.traffic_token_hash,
    metadata: row.metadata ?? {},
    envVars: row.env_vars ?? {},
    network: row.network,
    allowInternetAccess: row.allow_internet_access,
    egress: (row.egress as EgressPolicy | null | undefined) ?? null,
    volumeMounts: row.volume_mounts ?? [],
    durableSnapshotId: row.durable_snapshot_id ?? null,
    mcpServers: row.mcp_servers ?? [],
    autoPause: row.auto_pause,
    autoPauseMemory: row.auto_pause_memory,
    autoResume: row.auto_resume,
    idempotencyKey: row.idempotency_key,
    requestHash: row.request_hash,
    createdAt: row.created_at,
    startedAt: row.started_at,
    endAt: row.end_at,
    pausedAt: row.paused_at,
    endedAt: row.ended_at,
    endReason: row.end_reason,
  };
}

/** The state E2B clients see: `running` or `paused`; undefined when the sandbox is not listed. */
export function publicState(state: SandboxState): "running" | "paused" | undefined {
  if (state === "running" || state === "pausing") return "running";
  if (state === "paused" || state === "resuming") return "paused";
  return undefined;
}

/** A sandbox of the team that E2B clients can see (running or paused); never another team's. */
export async function getVisibleSandbox(db: Queryable, teamId: string, id: string): Promise<SandboxRow | undefined> {
  const result = await db.query(
    "SELECT * FROM sandboxes WHERE id = $1 AND team_id = $2 AND state IN ('running','pausing','paused','resuming')",
    [id, teamId],
  );
  return result.rows[0] ? toSandboxRow(result.rows[0]) : undefined;
}

export async function getSandbox(db: Queryable, id: string): Promise<SandboxRow | undefined> {
  const result = await db.query("SELECT * FROM sandboxes WHERE id = $1", [id]);
  return result.rows[0] ? toSandboxRow(result.rows[0]) : undefined;
}

/** Locks the row for one transition; the caller holds a transaction. */
/**
 * A create's `starting` → `running` with its `sandbox.started` event, in one statement (one round trip on every
 * create's path; it was six). The UPDATE takes the row lock (and skips a row no longer `starting`: undefined), then
 * the event takes the ledger lock, in that order (LATERAL): a transaction holding the ledger lock is at its end and
 * never waits for a row lock, so the two cannot deadlock.
 */
export async function markSandboxRunning(
  db: Queryable,
  id: string,
  to: { nodeId: string; exec: string; envdVersion: string | null; timeoutSeconds: number },
): Promise<SandboxRow | undefined> {
  const result = await db.query(
    `WITH started AS (
       UPDATE sandboxes SET state = 'running', node_id = $2, exec_id = $3, envd_version = COALESCE($4, envd_version),
         end_at = now() + make_interval(secs => $5) WHERE id = $1 AND state = 'starting' RETURNING *
     ), event AS (
       INSERT INTO sandbox_events (sandbox_id, team_id, type, from_state, to_state, data)
       SELECT started.id, started.team_id, 'sandbox.started', 'starting', 'running', $6::jsonb
       FROM started CROSS JOIN LATERAL
         (SELECT pg_advisory_xact_lock(${LEDGER_LOCK}) WHERE started.id IS NOT NULL) AS ledger_lock
     )
     SELECT * FROM started`,
    [id, to.nodeId, to.exec, to.envdVersion, to.timeoutSeconds, JSON.stringify({ node: to.nodeId, exec: to.exec })],
  );
  return result.rows[0] ? toSandboxRow(result.rows[0]) : undefined;
}

export async function lockSandbox(db: Queryable, id: string): Promise<SandboxRow | undefined> {
  const result = await db.query("SELECT * FROM sandboxes WHERE id = $1 FOR UPDATE", [id]);
  return result.rows[0] ? toSandboxRow(result.rows[0]) : undefined;
}

export interface ListQuery {
  readonly teamId: string;
  readonly states: readonly ("running" | "paused")[];
  readonly metadata: Record<string, string>;
  readonly startedAfter?: Date;
  readonly template?: string;
  readonly order: "asc" | "desc";
  readonly limit: number;
  readonly cursor?: ListCursor;
}

export interface ListCursor {
  readonly startedAt: Date;
  readonly id: string;
}

export interface ListPage {
  readonly sandboxes: SandboxRow[];
  readonly next?: ListCursor;
  readonly totalRunning: number;
}

export function encodeCursor(cursor: ListCursor): string {
  return encodeTimeCursor(cursor.startedAt, cursor.id);
}

export function decodeCursor(token: string): ListCursor | undefined {
  const cursor = decodeTimeCursor(token);
  return cursor ? { startedAt: cursor.at, id: cursor.id } : undefined;
}

/** One page of the team's sandboxes, ordered by start time then id, with a cursor when more remain. */
export async function listSandboxes(db: Queryable, query: ListQuery): Promise<ListPage> {
  const internal: string[] = [];
  if (query.states.includes("running")) internal.push("running", "pausing");
  if (query.states.includes("paused")) internal.push("paused", "resuming");
  const where = ["team_id = $1", "state = ANY($2)", "metadata @> $3::jsonb"];
  const params: unknown[] = [query.teamId, internal, JSON.stringify(query.metadata)];
  if (query.startedAfter) {
    params.push(query.startedAfter);
    where.push(`started_at >= $${params.length}`);
  }
  if (query.template !== undefined) {
    params.push(query.template);
    where.push(`(COALESCE(source_template_id, template_id) = $${params.length} OR alias = $${params.length})`);
  }
  const filter = where.join(" AND ");
  const totals = await db.query<{ n: string }>(
    `SELECT count(*) AS n FROM sandboxes WHERE ${filter} AND state IN ('running','pausing')`,
    params,
  );
  const pageParams = [...params];
  let pageFilter = filter;
  const cmp = query.order === "asc" ? ">" : "<";
  if (query.cursor) {
    pageParams.push(query.cursor.startedAt, query.cursor.id);
    pageFilter += ` AND (started_at, id) ${cmp} ($${pageParams.length - 1}, $${pageParams.length})`;
  }
  pageParams.push(query.limit + 1);
  const dir = query.order === "asc" ? "ASC" : "DESC";
  const result = await db.query(
    `SELECT * FROM sandboxes WHERE ${pageFilter} ORDER BY started_at ${dir}, id ${dir} LIMIT $${pageParams.length}`,
    pageParams,
  );
  const rows = result.rows.map(toSandboxRow);
  const sandboxes = rows.slice(0, query.limit);
  const last = sandboxes[sandboxes.length - 1];
  const next = rows.length > query.limit && last ? { startedAt: last.startedAt, id: last.id } : undefined;
  return { sandboxes, totalRunning: Number(totals.rows[0]?.n ?? 0), ...(next ? { next } : {}) };
}
