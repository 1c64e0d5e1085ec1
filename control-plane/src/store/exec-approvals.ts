import { randomBytes } from "node:crypto";
import { type Db, type Queryable, withTransaction } from "./db.js";
import { appendEvent } from "./events.js";

export type ApprovalKind = "start" | "write" | "remove";
export type ApprovalState = "pending" | "approved" | "rejected" | "used" | "expired";

/**
 * What a `review` rule held back, as the approver sees it. For a start: the command line, its user and cwd, the
 * names (never the values) of the env vars it sets; for a file operation: the path and the user.
 */
export interface ApprovalRequest {
  readonly commandLine?: string;
  readonly cmd?: string;
  readonly args?: readonly string[];
  readonly cwd?: string;
  readonly user: string;
  readonly envNames?: readonly string[];
  readonly pty?: boolean;
  readonly tag?: string;
  readonly path?: string;
}

export interface ExecApproval {
  readonly id: string;
  readonly teamId: string;
  readonly sandboxId: string;
  readonly kind: ApprovalKind;
  readonly request: ApprovalRequest;
  readonly rule: string;
  readonly state: ApprovalState;
  readonly requestedAt: Date;
  readonly expiresAt: Date;
  readonly decidedBy: string | null;
  readonly decidedAt: Date | null;
  readonly reason: string | null;
  readonly usedAt: Date | null;
}

interface ApprovalRow {
  id: string;
  team_id: string;
  sandbox_id: string;
  kind: ApprovalKind;
  request: ApprovalRequest;
  digest: string;
  rule: string;
  state: Exclude<ApprovalState, "expired">;
  requested_at: Date;
  expires_at: Date;
  decided_by: string | null;
  decided_at: Date | null;
  reason: string | null;
  used_at: Date | null;
}

function toApproval(row: ApprovalRow, now = new Date()): ExecApproval {
  const lapsed = row.expires_at.getTime() <= now.getTime();
  return {
    id: row.id,
    teamId: row.team_id,
    sandboxId: row.sandbox_id,
    kind: row.kind,
    request: row.request,
    rule: row.rule,
    // An approval not used in time is as dead as a review never decided.
    state: lapsed && (row.state === "pending" || row.state === "approved") ? "expired" : row.state,
    requestedAt: row.requested_at,
    expiresAt: row.expires_at,
    decidedBy: row.decided_by,
    decidedAt: row.decided_at,
    reason: row.reason,
    usedAt: row.used_at,
  };
}

/** The ledger's view of a held-back or refused request: what, as whom, where, by which rule. */
function ledgerData(kind: ApprovalKind, request: ApprovalRequest, rule: string): Record<string, unknown> {
  return {
    kind,
    ...(request.commandLine !== undefined ? { commandLine: request.commandLine } : {}),
    ...(request.path !== undefined ? { path: request.path } : {}),
    user: request.user,
    ...(request.cwd !== undefined ? { cwd: request.cwd } : {}),
    rule,
  };
}

export interface NewReview {
  readonly teamId: string;
  readonly sandboxId: string;
  readonly kind: ApprovalKind;
  readonly request: ApprovalRequest;
  readonly digest: string;
  readonly rule: string;
  readonly ttlSeconds: number;
}

/**
 * Opens a review for a held-back request, or answers the one still pending for the same request in the same
 * sandbox (a client that retries gets the same id, and the approver sees it once). New ones are in the ledger as
 * `exec.review_requested`.
 */
export async function openReview(db: Db, review: NewReview): Promise<{ approval: ExecApproval; created: boolean }> {
  return withTransaction(db, async (tx) => {
    // One opener per request at a time: two identical concurrent requests must not open two reviews.
    await tx.query("SELECT pg_advisory_xact_lock(hashtext($1))", [`${review.sandboxId}:${review.digest}`]);
    const pending = await tx.query<ApprovalRow>(
      `SELECT * FROM exec_approvals WHERE sandbox_id = $1 AND digest = $2 AND state = 'pending' AND expires_at > now()
       ORDER BY requested_at DESC LIMIT 1`,
      [review.sandboxId, review.digest],
    );
    if (pending.rows[0]) return { approval: toApproval(pending.rows[0]), created: false };
    const id = `apr_${randomBytes(10).toString("hex")}`;
    const inserted = await tx.query<ApprovalRow>(
      `INSERT INTO exec_approvals (id, team_id, sandbox_id, kind, request, digest, rule, state, expires_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', now() + make_interval(secs => $8)) RETURNING *`,
      [
        id,
        review.teamId,
        review.sandboxId,
        review.kind,
        JSON.stringify(review.request),
        review.digest,
        review.rule,
        review.ttlSeconds,
      ],
    );
    const row = inserted.rows[0] as ApprovalRow;
    await appendEvent(tx, {
      sandboxId: review.sandboxId,
      teamId: review.teamId,
      type: "exec.review_requested",
      data: { approvalId: id, ...ledgerData(review.kind, review.request, review.rule), expiresAt: row.expires_at },
    });
    return { approval: toApproval(row), created: true };
  });
}

/** A `deny` rule refused a request: `exec.denied` in the ledger. */
export async function recordDenial(
  db: Db,
  denial: Pick<NewReview, "teamId" | "sandboxId" | "kind" | "request" | "rule">,
): Promise<void> {
  await withTransaction(db, (tx) =>
    appendEvent(tx, {
      sandboxId: denial.sandboxId,
      teamId: denial.teamId,
      type: "exec.denied",
      data: ledgerData(denial.kind, denial.request, denial.rule),
    }),
  );
}

export class ApprovalStateError extends Error {
  constructor(
    readonly approval: ExecApproval,
    message: string,
  ) {
    super(message);
    this.name = "ApprovalStateError";
  }
}

export async function getApproval(db: Queryable, teamId: string, id: string): Promise<ExecApproval | undefined> {
  const result = await db.query<ApprovalRow>("SELECT * FROM exec_approvals WHERE id = $1 AND team_id = $2", [
    id,
    teamId,
  ]);
  return result.rows[0] ? toApproval(result.rows[0]) : undefined;
}

export interface ApprovalQuery {
  readonly teamId: string;
  readonly sandboxId?: string;
  readonly state?: ApprovalState;
  readonly limit: number;
}

/** Newest first. `expired` and `pending` are told apart by the clock, as toApproval does. */
export async function listApprovals(db: Queryable, query: ApprovalQuery): Promise<ExecApproval[]> {
  const where = ["team_id = $1"];
  const params: unknown[] = [query.teamId];
  if (query.sandboxId) {
    params.push(query.sandboxId);
    where.push(`sandbox_id = $${params.length}`);
  }
  if (query.state === "expired") where.push("state IN ('pending', 'approved') AND expires_at <= now()");
  else if (query.state === "pending" || query.state === "approved") {
    params.push(query.state);
    where.push(`state = $${params.length} AND expires_at > now()`);
  } else if (query.state) {
    params.push(query.state);
    where.push(`state = $${params.length}`);
  }
  params.push(query.limit);
  const result = await db.query<ApprovalRow>(
    `SELECT * FROM exec_approvals WHERE ${where.join(" AND ")} ORDER BY requested_at DESC, id DESC LIMIT $${params.length}`,
    params,
  );
  return result.rows.map((row) => toApproval(row));
}

/**
 * An approver's decision on a pending review: `exec.approved` or `exec.rejected` in the ledger. Undefined for an
 * unknown review (or another team's); ApprovalStateError when it is no longer pending (decided, used or expired).
 */
export async function decideApproval(
  db: Db,
  decision: { teamId: string; id: string; approve: boolean; keyId: string; reason?: string },
): Promise<ExecApproval | undefined> {
  return withTransaction(db, async (tx) => {
    const current = await tx.query<ApprovalRow>(
      "SELECT * FROM exec_approvals WHERE id = $1 AND team_id = $2 FOR UPDATE",
      [decision.id, decision.teamId],
    );
    const row = current.rows[0];
    if (!row) return undefined;
    const approval = toApproval(row);
    if (approval.state !== "pending") {
      throw new ApprovalStateError(approval, `approval ${approval.id} is ${approval.state}, not pending`);
    }
    const updated = await tx.query<ApprovalRow>(
      `UPDATE exec_approvals SET state = $2, decided_by = $3, decided_at = now(), reason = $4 WHERE id = $1 RETURNING *`,
      [decision.id, decision.approve ? "approved" : "rejected", decision.keyId, decision.reason ?? null],
    );
    const decided = updated.rows[0] as ApprovalRow;
    await appendEvent(tx, {
      sandboxId: row.sandbox_id,
      teamId: row.team_id,
      type: decision.approve ? "exec.approved" : "exec.rejected",
      data: {
        approvalId: row.id,
        ...ledgerData(row.kind, row.request, row.rule),
        decidedBy: decision.keyId,
        ...(decision.reason ? { reason: decision.reason } : {}),
      },
    });
    return toApproval(decided);
  });
}

/**
 * Uses an approval for the request it was given for, once: the same sandbox, the same digest, approved and not
 * expired. Ledger `exec.approval_used`. Otherwise ApprovalStateError (or undefined: unknown, another sandbox's)
 * saying why, and nothing changes.
 */
export async function redeemApproval(
  db: Db,
  use: { sandboxId: string; id: string; digest: string },
): Promise<ExecApproval | undefined> {
  return withTransaction(db, async (tx) => {
    const current = await tx.query<ApprovalRow>(
      "SELECT * FROM exec_approvals WHERE id = $1 AND sandbox_id = $2 FOR UPDATE",
      [use.id, use.sandboxId],
    );
    const row = current.rows[0];
    if (!row) return undefined;
    const approval = toApproval(row);
    if (approval.state !== "approved") {
      const why = {
        pending: "is still waiting for a decision",
        rejected: "was rejected",
        used: "was used already",
        expired: "was expired",
      }[approval.state];
      throw new ApprovalStateError(approval, `approval ${row.id} ${why}`);
    }
    if (row.digest !== use.digest) {
      throw new ApprovalStateError(approval, `approval ${row.id} was given for another request than this one`);
    }
    const updated = await tx.query<ApprovalRow>(
      "UPDATE exec_approvals SET state = 'used', used_at = now() WHERE id = $1 RETURNING *",
      [row.id],
    );
    await appendEvent(tx, {
      sandboxId: row.sandbox_id,
      teamId: row.team_id,
      type: "exec.approval_used",
      data: { approvalId: row.id, ...ledgerData(row.kind, row.request, row.rule) },
    });
    return toApproval(updated.rows[0] as ApprovalRow);
  });
}
