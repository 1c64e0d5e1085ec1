import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { EXEC_POLICIES_SYNCED_KEY } from "@warren/proto/exec-policy";
import { ApprovalRequiredError, ExecApprovals, ExecDeniedError, Sandbox as WarrenSandbox } from "@warren/sdk";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Issue 24 part 4 through the whole cluster: a team's exec policy (allow / deny / review rules on commands, root and
// file paths) enforced by the proxy on envd's Start and file writes whichever SDK sends them; reviews approved or
// rejected by an approver key; an approved request runs once, exactly as requested.
const dataDir = mkdtempSync(join(tmpdir(), "warren-exec-policy-"));
let cluster: LocalCluster;
let approverKey = "";
let otherTeamApproverKey = "";

const POLICY = {
  rules: [
    { name: "no curl", command: "curl *", action: "deny" },
    { name: "destructive", command: "rm -rf *", action: "review" },
    { name: "root", asRoot: true, action: "review" },
    { name: "etc", paths: ["/etc"], action: "deny" },
    { name: "keep", paths: ["/home/user/keep"], ops: ["remove"], action: "review" },
  ],
  reviewTtlSeconds: 600,
};

async function admin(method: string, path: string, body?: unknown) {
  const res = await fetch(`${cluster.env.WARREN_API_URL}${path}`, {
    method,
    headers: { "X-Admin-Token": cluster.env.WARREN_ADMIN_TOKEN, "Content-Type": "application/json" },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  return (await res.json()) as Record<string, unknown> & Record<string, unknown>[];
}

beforeAll(async () => {
  // LocalCluster wires the proxy to the api's internal paths (the gate's decisions) by default.
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    instancePrefix: "m",
    nodeCidr: () => "10.239.0.0/22",
    env: {
      // The leader re-syncs the policies' Redis mirror each pass.
      WARREN_RECONCILE_INTERVAL_MS: "1000",
    },
  });
  const env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
  const teams = (await admin("GET", "/warren/v1/admin/teams")) as unknown as { id: string }[];
  const team = teams[0] as { id: string };
  approverKey = (await admin("POST", `/warren/v1/admin/teams/${team.id}/api-keys`, { approver: true })).key as string;
  const other = (await admin("POST", "/warren/v1/admin/teams", { name: "other" })) as { team: { id: string } };
  otherTeamApproverKey = (
    await admin("POST", `/warren/v1/admin/teams/${other.team.id}/api-keys`, { name: "o", approver: true })
  ).key as string;
}, 900_000);

afterAll(async () => {
  await cluster?.stop();
  if (!process.env.WARREN_E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

function api(method: string, path: string, body?: unknown, apiKey = process.env.E2B_API_KEY as string) {
  return fetch(`${process.env.E2B_API_URL}${path}`, {
    method,
    headers: { "X-API-KEY": apiKey, "Content-Type": "application/json" },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
}

async function ledger(sandboxId: string): Promise<{ type: string; data: Record<string, unknown> }[]> {
  const res = await api("GET", `/warren/v1/sandboxes/${sandboxId}/events?limit=1000`);
  expect(res.status).toBe(200);
  const body = (await res.json()) as { events?: unknown[] } | unknown[];
  return (Array.isArray(body) ? body : (body.events ?? [])) as { type: string; data: Record<string, unknown> }[];
}

/** The approval id a held-back request's error names. */
async function heldBack(promise: Promise<unknown>): Promise<string> {
  const error = (await promise.then(
    () => undefined,
    (e: unknown) => e,
  )) as Error | undefined;
  expect(error, "the request should have been held back").toBeDefined();
  const match = /needs approval \(exec policy rule "[^"]+"\): approval (apr_[0-9a-f]{20})/.exec(error?.message ?? "");
  expect(match, error?.message).not.toBeNull();
  return match?.[1] as string;
}

const sandboxExists = async (sandbox: Sandbox, path: string) =>
  (await sandbox.commands.run(`test -e ${path}`).then(
    () => 0,
    (e: { exitCode?: number }) => e.exitCode ?? -1,
  )) === 0;

describe("exec policy", () => {
  it("is set only with an approver key, validated field by field, and read back", async () => {
    let res = await api("GET", "/warren/v1/me");
    expect(await res.json()).toMatchObject({ approver: false, keyID: expect.stringMatching(/^key_/) });
    res = await api("GET", "/warren/v1/me", undefined, approverKey);
    expect(await res.json()).toMatchObject({ approver: true });
    res = await api("GET", "/warren/v1/exec-policy");
    expect(await res.json()).toEqual({ policy: null });
    res = await api("PUT", "/warren/v1/exec-policy", POLICY);
    expect(res.status).toBe(403);
    expect(((await res.json()) as { message: string }).message).toMatch(/approver API key/);
    res = await api("PUT", "/warren/v1/exec-policy", { rules: [{ command: "x", action: "maybe" }] }, approverKey);
    expect(res.status).toBe(400);
    expect(((await res.json()) as { message: string }).message).toMatch(/rules\[0\]\.action/);
    res = await api("PUT", "/warren/v1/exec-policy", { rules: [{ paths: ["etc"], action: "deny" }] }, approverKey);
    expect(res.status).toBe(400);
    expect(((await res.json()) as { message: string }).message).toMatch(/rules\[0\]\.paths\[0\]/);
    res = await api("PUT", "/warren/v1/exec-policy", POLICY, approverKey);
    expect(res.status).toBe(200);
    res = await api("GET", "/warren/v1/exec-policy");
    expect(((await res.json()) as { policy: typeof POLICY }).policy.rules).toHaveLength(5);
  });

  it("lets an allowed command run and refuses a denied one naming its rule (official SDK), in the ledger", async () => {
    const sandbox = await Sandbox.create();
    try {
      expect((await sandbox.commands.run("echo allowed")).stdout).toBe("allowed\n");
      await expect(sandbox.commands.run("curl http://127.0.0.1:9/")).rejects.toThrow(
        /command denied by exec policy rule "no curl"/,
      );
      const denied = (await ledger(sandbox.sandboxId)).find((e) => e.type === "exec.denied");
      expect(denied?.data).toMatchObject({
        kind: "start",
        commandLine: "curl http://127.0.0.1:9/",
        user: "user",
        rule: "no curl",
      });
    } finally {
      await sandbox.kill();
    }
  });

  it("holds a review command until approved, then runs it once, exactly as requested (official SDK)", async () => {
    const sandbox = await Sandbox.create();
    const approvals = new ExecApprovals({ apiKey: approverKey });
    try {
      await sandbox.commands.run("mkdir -p /tmp/victim && touch /tmp/victim/a");
      const id = await heldBack(sandbox.commands.run("rm -rf /tmp/victim"));
      // A retry before any decision is the same review, not a second one.
      expect(await heldBack(sandbox.commands.run("rm -rf /tmp/victim"))).toBe(id);
      expect(await sandboxExists(sandbox, "/tmp/victim/a")).toBe(true);

      const pending = await approvals.get(id);
      expect(pending).toMatchObject({
        state: "pending",
        kind: "start",
        rule: "destructive",
        sandboxID: sandbox.sandboxId,
        request: { commandLine: "rm -rf /tmp/victim", user: "user", cwd: "/home/user" },
      });
      const requested = (await ledger(sandbox.sandboxId)).filter((e) => e.type === "exec.review_requested");
      expect(requested).toHaveLength(1);
      expect(requested[0]?.data).toMatchObject({
        approvalId: id,
        commandLine: "rm -rf /tmp/victim",
        user: "user",
        cwd: "/home/user",
      });

      // Not approved yet: the id does not let it through.
      await expect(sandbox.commands.run("rm -rf /tmp/victim", { envs: { WARREN_APPROVAL_ID: id } })).rejects.toThrow(
        /still waiting for a decision/,
      );
      // Only an approver decides.
      const notApprover = await api("POST", `/warren/v1/exec-approvals/${id}/approve`, {});
      expect(notApprover.status).toBe(403);
      expect((await approvals.approve(id, "cleanup is fine")).state).toBe("approved");
      const again = await api("POST", `/warren/v1/exec-approvals/${id}/approve`, {}, approverKey);
      expect(again.status).toBe(409);

      // Another command cannot ride on this approval.
      await expect(sandbox.commands.run("rm -rf /tmp", { envs: { WARREN_APPROVAL_ID: id } })).rejects.toThrow(
        /another request/,
      );
      const ran = await sandbox.commands.run("rm -rf /tmp/victim", { envs: { WARREN_APPROVAL_ID: id } });
      expect(ran.exitCode).toBe(0);
      expect(await sandboxExists(sandbox, "/tmp/victim")).toBe(false);
      // Once.
      await expect(sandbox.commands.run("rm -rf /tmp/victim", { envs: { WARREN_APPROVAL_ID: id } })).rejects.toThrow(
        /used already/,
      );
      expect((await approvals.get(id)).state).toBe("used");
      const types = (await ledger(sandbox.sandboxId)).map((e) => e.type);
      expect(types).toEqual(expect.arrayContaining(["exec.review_requested", "exec.approved", "exec.approval_used"]));
    } finally {
      await sandbox.kill();
    }
  });

  it("never runs a rejected command", async () => {
    const sandbox = await Sandbox.create();
    const approvals = new ExecApprovals({ apiKey: approverKey });
    try {
      await sandbox.commands.run("mkdir -p /tmp/keepme");
      const id = await heldBack(sandbox.commands.run("rm -rf /tmp/keepme"));
      expect((await approvals.reject(id, "no")).state).toBe("rejected");
      await expect(sandbox.commands.run("rm -rf /tmp/keepme", { envs: { WARREN_APPROVAL_ID: id } })).rejects.toThrow(
        /was rejected/,
      );
      expect(await sandboxExists(sandbox, "/tmp/keepme")).toBe(true);
      expect((await ledger(sandbox.sandboxId)).some((e) => e.type === "exec.rejected")).toBe(true);
    } finally {
      await sandbox.kill();
    }
  });

  it("reviews root commands; Warren's SDK raises ApprovalRequiredError and runs it with the approval", async () => {
    const sandbox = await WarrenSandbox.create();
    const approvals = new ExecApprovals({ apiKey: approverKey });
    try {
      const error = await sandbox.commands.run("id -u", { user: "root" }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ApprovalRequiredError);
      const id = (error as ApprovalRequiredError).approvalId;
      expect((await approvals.get(id)).request).toMatchObject({ user: "root", commandLine: "id -u", cwd: "/root" });
      await approvals.approve(id);
      const ran = await sandbox.commands.run("id -u", { user: "root", approval: id });
      expect(ran.stdout).toBe("0\n");
      // As the default user the same command is not root's: allowed.
      expect((await sandbox.commands.run("id -un")).stdout).toBe("user\n");
      await expect(sandbox.commands.run("curl -s x")).rejects.toBeInstanceOf(ExecDeniedError);
    } finally {
      await sandbox.kill();
    }
  });

  it("guards file writes and removes under the rules' paths, whichever way they are sent", async () => {
    const sandbox = await Sandbox.create();
    const warren = await WarrenSandbox.connect(sandbox.sandboxId);
    const approvals = new ExecApprovals({ apiKey: approverKey });
    try {
      await expect(sandbox.files.write("/etc/warren-x", "x")).rejects.toThrow(
        /file write denied by exec policy rule "etc"/,
      );
      expect(await sandboxExists(sandbox, "/etc/warren-x")).toBe(false);
      // A multi-file form is judged by every part's name: one denied path refuses the whole upload.
      await expect(
        sandbox.files.write([
          { path: "/tmp/ok.txt", data: "ok" },
          { path: "/etc/bad.txt", data: "bad" },
        ]),
      ).rejects.toThrow(/denied by exec policy rule "etc"/);
      expect(await sandboxExists(sandbox, "/tmp/ok.txt")).toBe(false);
      await expect(sandbox.files.makeDir("/etc/newdir")).rejects.toThrow(/denied by exec policy rule "etc"/);
      await sandbox.files.write("/tmp/movable", "m");
      await expect(sandbox.files.rename("/tmp/movable", "/etc/moved")).rejects.toThrow(/denied/);
      expect(await sandbox.files.exists("/tmp/movable")).toBe(true);

      // Writes under keep are allowed (the rule reviews removes only); a relative path resolves to the home.
      await sandbox.files.write("keep/a.txt", "1");
      expect(await sandbox.files.read("/home/user/keep/a.txt")).toBe("1");
      const id = await heldBack(sandbox.files.remove("/home/user/keep/a.txt"));
      expect((await approvals.get(id)).request).toMatchObject({ path: "/home/user/keep/a.txt", user: "user" });
      await approvals.approve(id);
      await warren.files.remove("/home/user/keep/a.txt", { approval: id });
      expect(await sandbox.files.exists("/home/user/keep/a.txt")).toBe(false);
      // Commands are judged by their own rules: a shell `rm` under keep is not a file operation of envd's.
      expect((await sandbox.commands.run("touch /home/user/keep/b && rm /home/user/keep/b")).exitCode).toBe(0);
    } finally {
      await sandbox.kill();
    }
  });

  it("keeps approvals within their team", async () => {
    const sandbox = await Sandbox.create();
    try {
      const id = await heldBack(sandbox.commands.run("rm -rf /tmp/x"));
      const seen = await api("GET", `/warren/v1/exec-approvals/${id}`, undefined, otherTeamApproverKey);
      expect(seen.status).toBe(404);
      const decided = await api("POST", `/warren/v1/exec-approvals/${id}/approve`, {}, otherTeamApproverKey);
      expect(decided.status).toBe(404);
      const listed = (await (
        await api("GET", "/warren/v1/exec-approvals", undefined, otherTeamApproverKey)
      ).json()) as unknown[];
      expect(listed).toEqual([]);
      const mine = (await (await api("GET", "/warren/v1/exec-approvals?state=pending")).json()) as {
        approvalID: string;
      }[];
      expect(mine.map((a) => a.approvalID)).toContain(id);
    } finally {
      await sandbox.kill();
    }
  });

  it("lets an approval expire unused: it can no longer be approved or used", async () => {
    let res = await api("PUT", "/warren/v1/exec-policy", { ...POLICY, reviewTtlSeconds: 1 }, approverKey);
    expect(res.status).toBe(200);
    const sandbox = await Sandbox.create();
    try {
      const id = await heldBack(sandbox.commands.run("rm -rf /tmp/late"));
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      res = await api("POST", `/warren/v1/exec-approvals/${id}/approve`, {}, approverKey);
      expect(res.status).toBe(409);
      expect(((await res.json()) as { message: string }).message).toMatch(/expired/);
      await expect(sandbox.commands.run("rm -rf /tmp/late", { envs: { WARREN_APPROVAL_ID: id } })).rejects.toThrow(
        /was expired/,
      );
    } finally {
      await sandbox.kill();
      await api("PUT", "/warren/v1/exec-policy", POLICY, approverKey);
    }
  });

  // The refusal while the stamp is missing is proxy/test/exec-gate.test.ts's; here, that the master brings it back.
  it("after Redis loses the policies, the master's next pass restores them and starts run again", async () => {
    const sandbox = await Sandbox.create();
    const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
    try {
      await redis.del(EXEC_POLICIES_SYNCED_KEY);
      // Whichever comes first: the refusal, or the leader's next pass (every second here) putting the stamp back.
      const first = await sandbox.commands.run("echo early").then(
        () => "ran",
        (e: Error) => e.message,
      );
      expect(first).toMatch(/^ran$|exec policies are not loaded yet/);
      const deadline = Date.now() + 30_000;
      for (;;) {
        const outcome = await sandbox.commands.run("echo back").then(
          (r) => r.stdout,
          () => undefined,
        );
        if (outcome === "back\n") break;
        if (Date.now() > deadline) throw new Error("the policies never came back");
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      expect(await redis.get(EXEC_POLICIES_SYNCED_KEY)).not.toBeNull();
      // The policy itself is back too: curl is still refused.
      await expect(sandbox.commands.run("curl x")).rejects.toThrow(/denied/);
    } finally {
      redis.disconnect();
      await sandbox.kill();
    }
  });

  it("without a policy, every request runs as on E2B", async () => {
    const res = await api("DELETE", "/warren/v1/exec-policy", undefined, approverKey);
    expect(res.status).toBe(204);
    const sandbox = await Sandbox.create();
    try {
      await sandbox.commands.run("mkdir -p /tmp/free");
      expect((await sandbox.commands.run("rm -rf /tmp/free")).exitCode).toBe(0);
      await sandbox.files.write("/tmp/etc-like", "x");
      expect((await sandbox.commands.run("id -u", { user: "root" })).stdout).toBe("0\n");
    } finally {
      await sandbox.kill();
    }
  });
});
