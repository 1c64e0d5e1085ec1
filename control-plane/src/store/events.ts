import type { Queryable } from "./db.js";

export interface SandboxEvent {
  /** The ledger cursor: strictly increasing in commit order. */
  readonly id: string;
  readonly sandboxId: string;
  readonly teamId: string;
  readonly type: string;
  readonly fromState: string | null;
  readonly toState: string | null;
  readonly data: Record<string, unknown>;
  readonly createdAt: Date;
}

export interface NewSandboxEvent {
  readonly sandboxId: string;
  readonly teamId: string;
  readonly type: string;
  readonly fromState?: string | null;
  readonly toState?: string | null;
  readonly data?: Record<string, unknown>;
}

/** Serializes the ledger's appends (see appendEvent); statements that append an event of their own take it too. */
export const LEDGER_LOCK = 0x4c45_4447; // "LEDG"

/**
 * The INSERT of one event that takes the ledger lock first, in one statement (one round trip): the lock is taken
 * while the subquery produces its row, before the row's id is drawn from the sequence. Its parameters are
 * appendEventParams's, numbered from `$first`.
 */
export function appendEventSql(first: number): string {
  const p = (i: number) => `$${first + i}`;
  return `INSERT INTO sandbox_events (sandbox_id, team_id, type, from_state, to_state, data)
     SELECT ${p(0)}, ${p(1)}, ${p(2)}, ${p(3)}, ${p(4)}, ${p(5)}::jsonb
     FROM (SELECT pg_advisory_xact_lock(${LEDGER_LOCK})) AS ledger_lock`;
}

/** The parameters of appendEventSql, in order. */
export function appendEventParams(event: NewSandboxEvent): unknown[] {
  return [
    event.sandboxId,
    event.teamId,
    event.type,
    event.fromState ?? null,
    event.toState ?? null,
    JSON.stringify(event.data ?? {}),
  ];
}

/**
 * Appends to the ledger inside the caller's transaction. The transaction-scoped lock serializes the tail of
 * concurrent transactions, so ids become visible in increasing order and a reader holding cursor N never
 * later finds an event below N: call this last, just before COMMIT.
 */
export async function appendEvent(tx: Queryable, event: NewSandboxEvent): Promise<void> {
  await tx.query(appendEventSql(1), appendEventParams(event));
}

export interface EventQuery {
  readonly teamId: string;
  readonly sandboxId?: string;
  /** Events with an id greater than this cursor. */
  readonly after?: string;
  readonly limit: number;
}

export async function readEvents(db: Queryable, query: EventQuery): Promise<SandboxEvent[]> {
  const params: unknown[] = [query.teamId, query.after ?? "0"];
  let filter = "team_id = $1 AND id > $2";
  if (query.sandboxId) {
    params.push(query.sandboxId);
    filter += ` AND sandbox_id = $${params.length}`;
  }
  params.push(query.limit);
  const result = await db.query(
    `SELECT * FROM sandbox_events WHERE ${filter} ORDER BY id LIMIT $${params.length}`,
    params,
  );
  return result.rows.map((row) => ({
    id: String(row.id),
    sandboxId: row.sandbox_id,
    teamId: row.team_id,
    type: row.type,
    fromState: row.from_state,
    toState: row.to_state,
    data: row.data ?? {},
    createdAt: row.created_at,
  }));
}

/** Whether the team has ever had this sandbox (its events outlive its row's visibility). */
export async function sandboxBelongsToTeam(db: Queryable, teamId: string, sandboxId: string): Promise<boolean> {
  const result = await db.query("SELECT 1 FROM sandboxes WHERE id = $1 AND team_id = $2", [sandboxId, teamId]);
  return (result.rowCount ?? 0) > 0;
}
