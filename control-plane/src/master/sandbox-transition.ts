import { type Db, type DbClient, withTransaction } from "../store/db.js";
import { appendEventParams, appendEventSql } from "../store/events.js";
import { lockSandbox, type SandboxRow, type SandboxState, toSandboxRow } from "../store/sandboxes.js";
import { notFound } from "./errors.js";

/**
 * Runs one transition under the row lock. `teamId` undefined means the master itself (evictor, reconciler).
 * Returns what `fn` returns; `fn` sees the locked row.
 */
export async function transition<T>(
  db: Db,
  sandboxId: string,
  teamId: string | undefined,
  fn: (tx: DbClient, row: SandboxRow) => Promise<T>,
): Promise<T> {
  return withTransaction(
    db,
    async (tx) => {
      const row = await lockSandbox(tx, sandboxId);
      if (!row || (teamId !== undefined && row.teamId !== teamId)) throw notFound(sandboxId);
      if (row.state === "killed" || row.state === "failed") throw notFound(sandboxId);
      return fn(tx, row);
    },
    { lockTimeoutMs: 30_000 },
  );
}

export async function setState(
  tx: DbClient,
  row: SandboxRow,
  to: SandboxState,
  type: string,
  data: Record<string, unknown> = {},
  extraSql = "",
  extraParams: unknown[] = [],
): Promise<SandboxRow> {
  // The update and its ledger event in one statement (one round trip less on every transition). The row is locked
  // already (transition), so the ledger lock the event takes cannot be waited for behind it.
  const event = appendEventParams({
    sandboxId: row.id,
    teamId: row.teamId,
    type,
    fromState: row.state,
    toState: to,
    data,
  });
  const result = await tx.query(
    `WITH updated AS (UPDATE sandboxes SET state = $2${extraSql} WHERE id = $1 RETURNING *),
       event AS (${appendEventSql(3 + extraParams.length)})
     SELECT * FROM updated`,
    [row.id, to, ...extraParams, ...event],
  );
  return toSandboxRow(result.rows[0]);
}
