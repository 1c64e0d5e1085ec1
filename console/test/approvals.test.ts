import { describe, expect, it } from "vitest";
import type { ExecApproval } from "../src/api.js";
import { approvalBoard, isPending, requestSummary, ruleMatches } from "../src/approvals.js";

const NOW = Date.parse("2026-01-01T12:00:00Z");

function approval(id: string, patch: Partial<ExecApproval> = {}): ExecApproval {
  return {
    approvalID: id,
    sandboxID: "sbx1",
    kind: "start",
    request: { commandLine: "rm -rf /tmp/x", user: "user", cwd: "/home/user" },
    rule: "destructive",
    state: "pending",
    requestedAt: "2026-01-01T11:59:00Z",
    expiresAt: "2026-01-01T12:30:00Z",
    decidedBy: null,
    decidedAt: null,
    reason: null,
    usedAt: null,
    ...patch,
  };
}

describe("approvals board", () => {
  it("says what was held back: the command line, program and arguments, or the file operation and path", () => {
    expect(requestSummary(approval("a"))).toBe("rm -rf /tmp/x");
    expect(requestSummary(approval("a", { request: { cmd: "/bin/rm", args: ["-rf", "/x"], user: "root" } }))).toBe(
      "/bin/rm -rf /x",
    );
    expect(requestSummary(approval("a", { kind: "remove", request: { path: "/home/user/keep", user: "user" } }))).toBe(
      "remove /home/user/keep",
    );
  });

  it("puts pending ones first, longest waiting on top, and a lapsed review among the decided as expired", () => {
    const older = approval("older", { requestedAt: "2026-01-01T11:00:00Z" });
    const newer = approval("newer", { requestedAt: "2026-01-01T11:50:00Z" });
    const lapsed = approval("lapsed", { requestedAt: "2026-01-01T10:00:00Z", expiresAt: "2026-01-01T11:00:00Z" });
    const used = approval("used", { state: "used", requestedAt: "2026-01-01T11:30:00Z" });
    const board = approvalBoard([newer, older, lapsed], [newer, used, older, lapsed], NOW);
    expect(board.pending.map((a) => a.approvalID)).toEqual(["older", "newer"]);
    expect(board.decided.map((a) => [a.approvalID, a.state])).toEqual([
      ["used", "used"],
      ["lapsed", "expired"],
    ]);
    expect(isPending(lapsed, NOW)).toBe(false);
  });

  it("lists an approval decided between the two reads once, as decided", () => {
    const board = approvalBoard([approval("a")], [approval("a", { state: "approved" })], NOW);
    expect(board.pending).toEqual([]);
    expect(board.decided.map((a) => a.state)).toEqual(["approved"]);
  });

  it("describes a rule by what it matches", () => {
    expect(ruleMatches({ command: "rm -rf *", action: "review" })).toBe('command "rm -rf *"');
    expect(ruleMatches({ asRoot: true, action: "review" })).toBe("any command run as root");
    expect(ruleMatches({ command: "apt *", asRoot: true, action: "deny" })).toBe('command "apt *", run as root');
    expect(ruleMatches({ paths: ["/etc"], action: "deny" })).toBe("write or remove under /etc");
    expect(ruleMatches({ paths: ["/a", "/b"], ops: ["remove"], action: "review" })).toBe("remove under /a, /b");
  });
});
