import type { ExecApproval, ExecRule } from "./api.js";

/** What was held back, in one line: the command line (or program and arguments), else the file operation. */
export function requestSummary(approval: ExecApproval): string {
  const request = approval.request;
  if (approval.kind === "start") {
    return request.commandLine ?? [request.cmd ?? "", ...(request.args ?? [])].join(" ").trim();
  }
  return `${approval.kind} ${request.path ?? ""}`.trim();
}

/** Still waiting for a decision at `now` (a review past its deadline is expired even before the api re-reads it). */
export function isPending(approval: ExecApproval, now: number): boolean {
  return approval.state === "pending" && Date.parse(approval.expiresAt) > now;
}

export interface ApprovalBoard {
  /** Longest waiting first. */
  readonly pending: ExecApproval[];
  /** Newest first, with a lapsed review shown as expired. */
  readonly decided: ExecApproval[];
}

/**
 * The pending list and the recent list (read concurrently) as one board, each approval once. When the two reads
 * disagree about one approval (it was decided between them), the decision wins: a decision is final.
 */
export function approvalBoard(pending: ExecApproval[], recent: ExecApproval[], now: number): ApprovalBoard {
  const byId = new Map<string, ExecApproval>();
  for (const approval of [...pending, ...recent]) {
    const seen = byId.get(approval.approvalID);
    if (!seen || seen.state === "pending") byId.set(approval.approvalID, approval);
  }
  const all = [...byId.values()];
  return {
    pending: all.filter((a) => isPending(a, now)).sort((a, b) => a.requestedAt.localeCompare(b.requestedAt)),
    decided: all
      .filter((a) => !isPending(a, now))
      .map((a) => (a.state === "pending" ? { ...a, state: "expired" as const } : a))
      .sort((a, b) => b.requestedAt.localeCompare(a.requestedAt)),
  };
}

/** What a rule matches, in words: its command pattern, root, and the file operations under its paths. */
export function ruleMatches(rule: ExecRule): string {
  const parts: string[] = [];
  if (rule.command !== undefined) parts.push(`command "${rule.command}"`);
  if (rule.asRoot) parts.push(rule.command !== undefined ? "run as root" : "any command run as root");
  if (rule.paths) parts.push(`${(rule.ops ?? ["write", "remove"]).join(" or ")} under ${rule.paths.join(", ")}`);
  return parts.join(", ") || "-";
}
