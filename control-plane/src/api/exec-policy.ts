import type { Client } from "@connectrpc/connect";
import { DEFAULT_REVIEW_TTL_SECONDS, ExecPolicyError, parseExecPolicy } from "@warren/proto/exec-policy";
import type { MasterService } from "@warren/proto/master/v1/master_pb";
import { execPolicyToMessage } from "@warren/proto/master-requests";
import type { ApiSchema } from "@warren/proto/openapi";
import { type Request, type Response, Router } from "express";
import type { Db } from "../store/db.js";
import { sandboxBelongsToTeam } from "../store/events.js";
import {
  type ApprovalKind,
  type ApprovalRequest,
  type ApprovalState,
  ApprovalStateError,
  decideApproval,
  type ExecApproval,
  getApproval,
  listApprovals,
  openReview,
  recordDenial,
  redeemApproval,
} from "../store/exec-approvals.js";
import type { ApiKeyIdentity } from "../store/teams.js";
import { ApiError, badRequest, fromMasterError } from "./errors.js";
import { requireInternalToken } from "./internal.js";
import { parseRequestBody } from "./openapi-requests.js";
import { team } from "./sandboxes.js";

export interface ExecPolicyRoutesDeps {
  readonly db: Db;
  readonly master: Client<typeof MasterService>;
}

const APPROVAL_ID = /^apr_[0-9a-f]{20}$/;
const STATES: readonly ApprovalState[] = ["pending", "approved", "rejected", "used", "expired"];
const KINDS: readonly ApprovalKind[] = ["start", "write", "remove"];

function approvalView(approval: ExecApproval): ApiSchema<"ExecApproval"> {
  return {
    approvalID: approval.id,
    sandboxID: approval.sandboxId,
    kind: approval.kind,
    request: approval.request,
    rule: approval.rule,
    state: approval.state,
    requestedAt: approval.requestedAt.toISOString(),
    expiresAt: approval.expiresAt.toISOString(),
    decidedBy: approval.decidedBy,
    decidedAt: approval.decidedAt?.toISOString() ?? null,
    reason: approval.reason,
    usedAt: approval.usedAt?.toISOString() ?? null,
  };
}

function requireApprover(res: Response, what: string): ApiKeyIdentity {
  const identity = res.locals.apiKey as ApiKeyIdentity;
  if (!identity.approver) throw new ApiError(403, `${what} needs an approver API key (this key is not one)`);
  return identity;
}

function objectBody(body: unknown): Record<string, unknown> {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw badRequest("body must be a JSON object");
  return body as Record<string, unknown>;
}

function approvalId(req: Request): string {
  const id = String(req.params.approvalID);
  if (!APPROVAL_ID.test(id)) throw new ApiError(404, `approval '${id}' not found`);
  return id;
}

/**
 * A team's exec policy and its approvals (issue 24 part 4).
 *
 * - `GET /warren/v1/exec-policy` → `{policy}` (null: none); `PUT` (approver key) replaces it; `DELETE` (approver)
 *   clears it. The master stores and mirrors it to Redis; the proxies enforce it on envd's Start and file writes.
 * - `GET /warren/v1/exec-approvals?state=&sandboxID=&limit=`, `GET /warren/v1/exec-approvals/{id}`;
 *   `POST …/{id}/approve` and `…/{id}/reject` (approver key, optional `{reason}`): 409 unless pending.
 */
export function execPolicyRoutes(deps: ExecPolicyRoutesDeps): Router {
  const router = Router();

  // Who the request's key is: its team and whether it may decide (the console asks before it offers the buttons).
  router.get("/warren/v1/me", (_req, res) => {
    const identity = res.locals.apiKey as ApiKeyIdentity;
    res.status(200).json({
      teamID: identity.team.id,
      teamName: identity.team.name,
      keyID: identity.keyId,
      approver: identity.approver,
    });
  });

  router.get("/warren/v1/exec-policy", async (_req, res) => {
    const result = await deps.db.query<{ policy: unknown }>("SELECT exec_policy AS policy FROM teams WHERE id = $1", [
      team(res).id,
    ]);
    res.status(200).json({ policy: result.rows[0]?.policy ?? null });
  });

  router.put("/warren/v1/exec-policy", async (req, res) => {
    requireApprover(res, "changing the exec policy");
    let policy: ReturnType<typeof parseExecPolicy>;
    try {
      policy = parseExecPolicy(parseRequestBody("/warren/v1/exec-policy", "put", req.body));
    } catch (error) {
      if (error instanceof ExecPolicyError) throw badRequest(`exec policy: ${error.message}`);
      throw error;
    }
    try {
      await deps.master.setExecPolicy({ teamId: team(res).id, policy: execPolicyToMessage(policy) });
    } catch (error) {
      throw fromMasterError(error);
    }
    res.status(200).json({ policy });
  });

  router.delete("/warren/v1/exec-policy", async (_req, res) => {
    requireApprover(res, "clearing the exec policy");
    try {
      await deps.master.setExecPolicy({ teamId: team(res).id });
    } catch (error) {
      throw fromMasterError(error);
    }
    res.status(204).end();
  });

  router.get("/warren/v1/exec-approvals", async (req, res) => {
    const { state, sandboxID, limit } = req.query;
    if (state !== undefined && !STATES.includes(state as ApprovalState)) {
      throw badRequest(`state must be one of ${STATES.join(", ")}`);
    }
    if (sandboxID !== undefined && (typeof sandboxID !== "string" || !/^[a-z0-9-]{1,63}$/.test(sandboxID))) {
      throw badRequest("sandboxID must be a sandbox id");
    }
    const count = limit === undefined ? 100 : Number(limit);
    if (!Number.isInteger(count) || count < 1 || count > 1000) throw badRequest("limit must be an integer 1..1000");
    const approvals = await listApprovals(deps.db, {
      teamId: team(res).id,
      limit: count,
      ...(state ? { state: state as ApprovalState } : {}),
      ...(sandboxID ? { sandboxId: sandboxID as string } : {}),
    });
    res.status(200).json(approvals.map(approvalView));
  });

  router.get("/warren/v1/exec-approvals/:approvalID", async (req, res) => {
    const id = approvalId(req);
    const approval = await getApproval(deps.db, team(res).id, id);
    if (!approval) throw new ApiError(404, `approval '${id}' not found`);
    res.status(200).json(approvalView(approval));
  });

  for (const verdict of ["approve", "reject"] as const) {
    router.post(`/warren/v1/exec-approvals/:approvalID/${verdict}`, async (req, res) => {
      const identity = requireApprover(res, `to ${verdict} a command`);
      const id = approvalId(req);
      const { reason } = parseRequestBody(`/warren/v1/exec-approvals/{approvalID}/${verdict}`, "post", req.body);
      try {
        const decided = await decideApproval(deps.db, {
          teamId: identity.team.id,
          id,
          approve: verdict === "approve",
          keyId: identity.keyId,
          ...(reason ? { reason } : {}),
        });
        if (!decided) throw new ApiError(404, `approval '${id}' not found`);
        res.status(200).json(approvalView(decided));
      } catch (error) {
        if (error instanceof ApprovalStateError) throw new ApiError(409, error.message);
        throw error;
      }
    });
  }
  return router;
}

function text(value: unknown, field: string, max: number): string {
  if (typeof value !== "string" || value.length > max) throw badRequest(`${field} must be a string`);
  return value;
}

/** The held-back request as the proxy describes it; only the fields the approver needs are kept. */
function approvalRequest(raw: unknown): ApprovalRequest {
  const obj = objectBody(raw);
  const strings = (value: unknown, field: string) => {
    if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) throw badRequest(`${field} must be strings`);
    return value as string[];
  };
  return {
    user: text(obj.user, "request.user", 256),
    ...(obj.commandLine !== undefined ? { commandLine: text(obj.commandLine, "request.commandLine", 65_536) } : {}),
    ...(obj.cmd !== undefined ? { cmd: text(obj.cmd, "request.cmd", 4096) } : {}),
    ...(obj.args !== undefined ? { args: strings(obj.args, "request.args") } : {}),
    ...(obj.cwd !== undefined ? { cwd: text(obj.cwd, "request.cwd", 4096) } : {}),
    ...(obj.envNames !== undefined ? { envNames: strings(obj.envNames, "request.envNames") } : {}),
    ...(obj.pty !== undefined ? { pty: obj.pty === true } : {}),
    ...(obj.tag !== undefined ? { tag: text(obj.tag, "request.tag", 1024) } : {}),
    ...(obj.path !== undefined ? { path: text(obj.path, "request.path", 4096) } : {}),
  };
}

/**
 * The proxies' side, with the internal token:
 * - `POST /warren/v1/internal/exec-decisions` `{sandboxId, teamId, action: deny|review, kind, request, digest, rule,
 *   ttlSeconds?}`: a deny is recorded (`exec.denied`) → 200 `{}`; a review is opened (or the pending one for the
 *   same request found) → 200 `{approvalId, expiresAt}`.
 * - `POST /warren/v1/internal/exec-approvals/redeem` `{sandboxId, approvalId, digest}` → 200 when the approval is
 *   used now for this request; 403 `{message}` saying why not.
 */
export function execPolicyInternalRoutes(deps: ExecPolicyRoutesDeps, internalToken: string): Router {
  const router = Router();
  if (!internalToken) return router;

  router.post("/warren/v1/internal/exec-decisions", async (req, res) => {
    requireInternalToken(req, internalToken);
    const obj = objectBody(req.body);
    const sandboxId = text(obj.sandboxId, "sandboxId", 63);
    const teamId = text(obj.teamId, "teamId", 128);
    const kind = obj.kind as ApprovalKind;
    if (!KINDS.includes(kind)) throw badRequest(`kind must be one of ${KINDS.join(", ")}`);
    const rule = text(obj.rule, "rule", 256);
    // The route names the team; a sandbox of another team (a stale route) must not open reviews in this one.
    if (!(await sandboxBelongsToTeam(deps.db, teamId, sandboxId))) throw new ApiError(404, "sandbox not found");
    const request = approvalRequest(obj.request);
    if (obj.action === "deny") {
      await recordDenial(deps.db, { teamId, sandboxId, kind, request, rule });
      res.status(200).json({});
      return;
    }
    if (obj.action !== "review") throw badRequest("action must be deny or review");
    const digest = text(obj.digest, "digest", 128);
    const ttl = obj.ttlSeconds === undefined ? DEFAULT_REVIEW_TTL_SECONDS : Number(obj.ttlSeconds);
    if (!Number.isInteger(ttl) || ttl < 1 || ttl > 604_800) throw badRequest("ttlSeconds must be 1..604800");
    const { approval } = await openReview(deps.db, {
      teamId,
      sandboxId,
      kind,
      request,
      digest,
      rule,
      ttlSeconds: ttl,
    });
    res.status(200).json({ approvalId: approval.id, expiresAt: approval.expiresAt.toISOString() });
  });

  router.post("/warren/v1/internal/exec-approvals/redeem", async (req, res) => {
    requireInternalToken(req, internalToken);
    const obj = objectBody(req.body);
    const sandboxId = text(obj.sandboxId, "sandboxId", 63);
    const id = text(obj.approvalId, "approvalId", 64);
    const digest = text(obj.digest, "digest", 128);
    if (!APPROVAL_ID.test(id)) throw new ApiError(403, `approval '${id}' is unknown`);
    try {
      const used = await redeemApproval(deps.db, { sandboxId, id, digest });
      if (!used) throw new ApiError(403, `approval '${id}' is unknown or for another sandbox`);
      res.status(200).json({ approvalId: used.id });
    } catch (error) {
      if (error instanceof ApprovalStateError) throw new ApiError(403, error.message);
      throw error;
    }
  });
  return router;
}
