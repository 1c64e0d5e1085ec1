import { readFile } from "node:fs/promises";
import type { ConnectionOpts } from "../config.js";
import { type ApprovalState, type ExecApproval, ExecApprovals, type ExecPolicy } from "../exec-policy.js";
import { CliError, ExitCode } from "./errors.js";
import { type Output, table } from "./output.js";

const STATES: readonly ApprovalState[] = ["pending", "approved", "rejected", "used", "expired"];

function what(approval: ExecApproval): string {
  return approval.request.commandLine ?? approval.request.path ?? approval.kind;
}

/** `warren approval list [--state S] [--sandbox ID]`. */
export async function listApprovals(
  conn: ConnectionOpts,
  opts: { state?: string; sandbox?: string },
  out: Output,
): Promise<number> {
  if (opts.state !== undefined && !STATES.includes(opts.state as ApprovalState)) {
    throw new CliError(`--state must be one of ${STATES.join(", ")}`, undefined, ExitCode.usage);
  }
  const approvals = await new ExecApprovals(conn).list({
    ...(opts.state ? { state: opts.state as ApprovalState } : {}),
    ...(opts.sandbox ? { sandboxId: opts.sandbox } : {}),
  });
  out.result(approvals, () =>
    approvals.length === 0
      ? "no approvals"
      : table([
          ["APPROVAL ID", "SANDBOX", "STATE", "USER", "RULE", "REQUEST"],
          ...approvals.map((a) => [a.approvalID, a.sandboxID, a.state, a.request.user, a.rule, what(a)]),
        ]),
  );
  return ExitCode.ok;
}

/** `warren approval show ID`: the whole request an approver decides on. */
export async function showApproval(conn: ConnectionOpts, id: string, out: Output): Promise<number> {
  const approval = await new ExecApprovals(conn).get(id);
  out.result(approval, () =>
    [
      `approval   ${approval.approvalID} (${approval.state})`,
      `sandbox    ${approval.sandboxID}`,
      `kind       ${approval.kind}`,
      `request    ${what(approval)}`,
      `user       ${approval.request.user}`,
      ...(approval.request.cwd ? [`cwd        ${approval.request.cwd}`] : []),
      ...(approval.request.envNames?.length ? [`env names  ${approval.request.envNames.join(", ")}`] : []),
      `rule       ${approval.rule}`,
      `requested  ${approval.requestedAt}`,
      `expires    ${approval.expiresAt}`,
      ...(approval.decidedAt ? [`decided    ${approval.decidedAt} by ${approval.decidedBy}`] : []),
      ...(approval.reason ? [`reason     ${approval.reason}`] : []),
    ].join("\n"),
  );
  return ExitCode.ok;
}

/** `warren approval approve|reject ID [--reason R]` (an approver key). */
export async function decideApproval(
  conn: ConnectionOpts,
  id: string,
  verdict: "approve" | "reject",
  opts: { reason?: string },
  out: Output,
): Promise<number> {
  const approvals = new ExecApprovals(conn);
  const decided =
    verdict === "approve" ? await approvals.approve(id, opts.reason) : await approvals.reject(id, opts.reason);
  out.result(decided, () => `${decided.approvalID} ${decided.state}: ${what(decided)}`);
  return ExitCode.ok;
}

/** `warren exec-policy get|set FILE|clear`. */
export async function execPolicy(
  conn: ConnectionOpts,
  action: "get" | "set" | "clear",
  file: string | undefined,
  out: Output,
): Promise<number> {
  const approvals = new ExecApprovals(conn);
  if (action === "clear") {
    await approvals.clearPolicy();
    out.result({ policy: null }, () => "exec policy cleared");
    return ExitCode.ok;
  }
  if (action === "set") {
    if (!file) throw new CliError("exec-policy set needs a JSON file", undefined, ExitCode.usage);
    let policy: ExecPolicy;
    try {
      policy = JSON.parse(await readFile(file, "utf8")) as ExecPolicy;
    } catch (error) {
      throw new CliError(`${file} is not a JSON policy: ${(error as Error).message}`, undefined, ExitCode.usage);
    }
    const stored = await approvals.setPolicy(policy);
    out.result({ policy: stored }, () => `exec policy set: ${stored.rules.length} rule(s)`);
    return ExitCode.ok;
  }
  const policy = await approvals.getPolicy();
  out.result({ policy }, () => (policy ? JSON.stringify(policy, null, 2) : "no exec policy (every request allowed)"));
  return ExitCode.ok;
}
