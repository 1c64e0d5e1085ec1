import { ApiClient } from "./api.js";
import type { ConnectionConfig, ConnectionOpts } from "./config.js";
import { TimeoutError } from "./errors.js";

/** One rule of a team's exec policy; the server's contract is `@warren/proto/exec-policy`. */
export interface ExecRule {
  name?: string;
  action: "allow" | "deny" | "review";
  /** Wildcard (`*`, `?`) on the command line (for `bash -c SCRIPT`, the script). */
  command?: string;
  /** Matches commands run as root. */
  asRoot?: boolean;
  /** Absolute paths: file operations on them or under them. */
  paths?: string[];
  ops?: ("write" | "remove")[];
}

export interface ExecPolicy {
  rules: ExecRule[];
  default?: "allow" | "deny" | "review";
  reviewTtlSeconds?: number;
}

export type ApprovalState = "pending" | "approved" | "rejected" | "used" | "expired";

export interface ExecApproval {
  approvalID: string;
  sandboxID: string;
  kind: "start" | "write" | "remove";
  request: {
    commandLine?: string;
    cmd?: string;
    args?: string[];
    cwd?: string;
    user: string;
    envNames?: string[];
    path?: string;
  };
  rule: string;
  state: ApprovalState;
  requestedAt: string;
  expiresAt: string;
  decidedBy: string | null;
  decidedAt: string | null;
  reason: string | null;
  usedAt: string | null;
}

export interface ApprovalListOpts {
  state?: ApprovalState;
  sandboxId?: string;
  limit?: number;
}

/**
 * Warren extra: the team's exec policy and its approvals (`/warren/v1/exec-policy`, `/warren/v1/exec-approvals`).
 * Changing the policy and deciding approvals needs an approver API key.
 */
export class ExecApprovals {
  private readonly api: ApiClient;

  constructor(opts: ConnectionOpts | ConnectionConfig = {}) {
    this.api = new ApiClient(opts);
  }

  async getPolicy(): Promise<ExecPolicy | null> {
    const res = await this.api.request<{ policy: ExecPolicy | null }>({
      method: "GET",
      path: "/warren/v1/exec-policy",
    });
    return res.body.policy;
  }

  async setPolicy(policy: ExecPolicy): Promise<ExecPolicy> {
    const res = await this.api.request<{ policy: ExecPolicy }>({
      method: "PUT",
      path: "/warren/v1/exec-policy",
      body: policy,
    });
    return res.body.policy;
  }

  async clearPolicy(): Promise<void> {
    await this.api.request({ method: "DELETE", path: "/warren/v1/exec-policy" });
  }

  async list(opts: ApprovalListOpts = {}): Promise<ExecApproval[]> {
    const res = await this.api.request<ExecApproval[]>({
      method: "GET",
      path: "/warren/v1/exec-approvals",
      query: {
        state: opts.state,
        sandboxID: opts.sandboxId,
        limit: opts.limit === undefined ? undefined : String(opts.limit),
      },
    });
    return res.body;
  }

  async get(approvalId: string): Promise<ExecApproval> {
    const res = await this.api.request<ExecApproval>({
      method: "GET",
      path: `/warren/v1/exec-approvals/${encodeURIComponent(approvalId)}`,
    });
    return res.body;
  }

  async approve(approvalId: string, reason?: string): Promise<ExecApproval> {
    return this.decide(approvalId, "approve", reason);
  }

  async reject(approvalId: string, reason?: string): Promise<ExecApproval> {
    return this.decide(approvalId, "reject", reason);
  }

  /** Polls until the approval is no longer pending (approved, rejected or expired) or `timeoutMs` passes. */
  async waitForDecision(
    approvalId: string,
    opts: { timeoutMs?: number; intervalMs?: number } = {},
  ): Promise<ExecApproval> {
    const deadline = Date.now() + (opts.timeoutMs ?? 300_000);
    for (;;) {
      const approval = await this.get(approvalId);
      if (approval.state !== "pending") return approval;
      if (Date.now() >= deadline) throw new TimeoutError(`approval ${approvalId} is still pending`);
      await new Promise((resolve) => setTimeout(resolve, opts.intervalMs ?? 1_000));
    }
  }

  private async decide(approvalId: string, verdict: "approve" | "reject", reason?: string): Promise<ExecApproval> {
    const res = await this.api.request<ExecApproval>({
      method: "POST",
      path: `/warren/v1/exec-approvals/${encodeURIComponent(approvalId)}/${verdict}`,
      body: reason === undefined ? {} : { reason },
    });
    return res.body;
  }
}
