import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { freePort, waitFor } from "@warren/local/services";
import { Sandbox as WarrenSandbox } from "@warren/sdk";
import { Sandbox, Secret } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Issue 24 parts 1 and 2 through the whole cluster: E2B's Secrets API (official SDK), secrets injected into one
// command (Warren SDK: a one-time grant the proxy redeems; official SDK: the grant in Start's envs), masked in its
// output and absent from everything else, and process leases (reap, renew, paused clock).
const dataDir = mkdtempSync(join(tmpdir(), "warren-harness-"));
const internalToken = randomBytes(24).toString("hex");
const secretsKeys = `k2:${randomBytes(32).toString("base64")},k1:${randomBytes(32).toString("base64")}`;
let cluster: LocalCluster;
let apiKeyB = "";

beforeAll(async () => {
  const apiPort = await freePort();
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    instancePrefix: "s",
    nodeCidr: () => "10.246.0.0/22",
    apiPort,
    env: {
      WARREN_SECRETS_KEYS: secretsKeys,
      WARREN_INTERNAL_TOKEN: internalToken,
      PROXY_RESUME_URL: `http://127.0.0.1:${apiPort}`,
      // The leader's sampling pass also brings envd's lease journal into the ledger.
      WARREN_METRICS_INTERVAL_MS: "1000",
      // A deleted snapshot leaves the template store at the leader's next collection, not minutes later.
      WARREN_STORE_GC_INTERVAL_MS: "1000",
    },
  });
  const env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
  const res = await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams`, {
    method: "POST",
    headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN, "Content-Type": "application/json" },
    body: JSON.stringify({ name: "team-b" }),
  });
  apiKeyB = ((await res.json()) as { apiKey: { key: string } }).apiKey.key;
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

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

/** Files under the cluster's data dir (logs, node state, snapshot layers, PostgreSQL, Redis) holding `value`. */
function filesHolding(value: string): string[] {
  try {
    const out = execFileSync("grep", ["-rlaF", "--no-messages", "--", value, dataDir], {
      encoding: "utf8",
      timeout: 300_000,
      maxBuffer: 16 << 20,
    });
    return out.split("\n").filter(Boolean);
  } catch (error) {
    if ((error as { status?: number }).status === 1) return [];
    throw error;
  }
}

// Inside the sandbox: the pids whose environment holds a value with this sha256 (the value itself never appears in
// a command line), each with its parent chain.
const SCAN = `python3 - "$H" <<'PY'
import hashlib, os, sys
want = sys.argv[1]
for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):
    try:
        env = open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if any(hashlib.sha256(e.split(b'=', 1)[-1]).hexdigest() == want for e in env if b'=' in e):
        chain, p = [], pid
        while p > 1:
            chain.append(p)
            p = int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])
        print(pid, ' '.join(map(str, chain)))
PY`;

describe("secrets: E2B's API with the official SDK", () => {
  it("creates, reads, lists in pages, updates, checks and destroys a team's secrets; another team sees none", async () => {
    const a = await Secret.create("Harness-One", "value-one", { metadata: { env: "test" } });
    expect(a).toMatchObject({ name: "harness-one", version: 1, metadata: { env: "test" } });
    expect(a.secretId).toMatch(/^sec_/);
    await Secret.create("harness-two", "value-two");
    await Secret.create("harness-three", "value-three");
    await expect(Secret.create("harness-one", "again")).rejects.toThrow(/already exists/);
    await expect(Secret.create("sec_x", "v")).rejects.toThrow(/reserved/);
    await expect(Secret.create("bad{name", "v")).rejects.toThrow();

    expect((await Secret.getInfo(a.secretId)).name).toBe("harness-one");
    expect((await Secret.getInfo("harness-one")).secretId).toBe(a.secretId);
    const updated = await Secret.update("harness-one", "value-one-v2");
    expect(updated.version).toBe(2);
    expect(updated.metadata).toEqual({ env: "test" });
    expect(updated.updatedAt.getTime()).toBeGreaterThanOrEqual(a.updatedAt.getTime());

    const paginator = Secret.list({ limit: 2 });
    const pages: string[][] = [];
    while (paginator.hasNext) pages.push((await paginator.nextItems()).map((s) => s.name));
    expect(pages[0]).toHaveLength(2);
    expect(pages.flat()).toEqual(["harness-three", "harness-two", "harness-one"]);
    // No read surface carries a value.
    const listed = await api("GET", "/secrets");
    expect(await listed.text()).not.toMatch(/value-/);

    // Team B: 404 for everything of team A's, and its own list is empty.
    const b = { apiKey: apiKeyB };
    expect(await Secret.exists(a.secretId, b)).toBe(false);
    await expect(Secret.getInfo("harness-one", b)).rejects.toThrow(/not found/);
    await expect(Secret.update(a.secretId, "stolen", b)).rejects.toThrow(/not found/);
    expect(await Secret.destroy("harness-one", b)).toBe(false);
    expect(await Secret.list(b).nextItems()).toEqual([]);
    expect(await Secret.exists("harness-one")).toBe(true);

    expect(await Secret.destroy("harness-two")).toBe(true);
    expect(await Secret.destroy(a.secretId)).toBe(true);
    expect(await Secret.exists("harness-one")).toBe(false);
    expect(await Secret.destroy("harness-one")).toBe(false);
    // Stored sealed: PostgreSQL's files never hold a value in plain text.
    expect(filesHolding("value-three")).toEqual([]);
  }, 120_000);
});

describe("secrets in one command", () => {
  const value = `tok-${randomBytes(18).toString("hex")}`;
  let sandboxId = "";

  beforeAll(async () => {
    await Secret.create("harness-token", value);
    sandboxId = (await Sandbox.create()).sandboxId;
  }, 120_000);

  it("gives the value to its command only, masked in its output, and to no other process, /init env or /proc/1", async () => {
    const sbx = await WarrenSandbox.connect(sandboxId);
    const other = await sbx.commands.run("sleep 300", { background: true });
    const holder = await sbx.commands.run("sleep 300", { background: true, secrets: ["harness-token"] });

    const own = await sbx.commands.run(
      `echo "token=$HARNESS_TOKEN"; printf %s "\${HARNESS_TOKEN:0:7}"; sleep 0.3; printf '%s\\n' "\${HARNESS_TOKEN:7}"; printf %s "$HARNESS_TOKEN" | sha256sum`,
      { secrets: ["harness-token"] },
    );
    expect(own.stdout).toContain("token=***\n");
    // Split across two writes, still masked.
    expect(own.stdout).toContain("***\n");
    expect(own.stdout).not.toContain(value);
    expect(own.stdout).toContain(sha256(value));

    // An env var name of the caller's choosing.
    const named = await sbx.commands.run('printf %s "$MY_KEY" | sha256sum', { secrets: { MY_KEY: "harness-token" } });
    expect(named.stdout).toContain(sha256(value));

    // Every process's environment, scanned by hash from a command without secrets: only the holder's tree.
    const scan = await sbx.commands.run(SCAN, { envs: { H: sha256(value) } });
    const found = scan.stdout.trim().split("\n").filter(Boolean);
    expect(found.length).toBeGreaterThan(0);
    for (const line of found) expect(line.split(" ").slice(1)).toContain(String(holder.pid));
    expect(found.some((line) => line.split(" ")[0] === String(other.pid))).toBe(false);
    expect(found.some((line) => line.split(" ")[0] === "1")).toBe(false);
    const plain = await sbx.commands.run('printf %s "${HARNESS_TOKEN:-unset}"');
    expect(plain.stdout).toBe("unset");
    const connected = await api("POST", `/sandboxes/${sandboxId}/connect`, { timeout: 300 });
    const token = ((await connected.json()) as { envdAccessToken?: string }).envdAccessToken ?? "";
    const envs = await fetch(`${process.env.E2B_SANDBOX_URL}/envs`, {
      headers: {
        "E2b-Sandbox-Id": sandboxId,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": token,
      },
    });
    expect(envs.status).toBe(200);
    expect(await envs.text()).not.toContain(value);
    const listed = await sbx.commands.list();
    expect(JSON.stringify(listed)).not.toContain(value);
    await holder.kill();
    await other.kill();
  }, 120_000);

  it("carries a grant in the official SDK's envs; a grant works once, for its sandbox, and an unknown secret is a 404", async () => {
    const grantFor = async (id: string) => {
      const res = await api("POST", `/warren/v1/sandboxes/${id}/secret-grants`, { secrets: ["harness-token"] });
      expect(res.status).toBe(201);
      return ((await res.json()) as { grant: string }).grant;
    };
    const sbx = await Sandbox.connect(sandboxId);
    const grant = await grantFor(sandboxId);
    const out = await sbx.commands.run(
      'printf %s "$HARNESS_TOKEN" | sha256sum; printf %s "${WARREN_SECRET_GRANT:-gone}"',
      {
        envs: { WARREN_SECRET_GRANT: grant },
      },
    );
    expect(out.stdout).toContain(sha256(value));
    expect(out.stdout).toContain("gone");
    await expect(sbx.commands.run("true", { envs: { WARREN_SECRET_GRANT: grant } })).rejects.toThrow(
      /unknown, used, expired or for another sandbox/,
    );
    const missing = await api("POST", `/warren/v1/sandboxes/${sandboxId}/secret-grants`, { secrets: ["nope"] });
    expect(missing.status).toBe(404);
    const otherTeam = await api(
      "POST",
      `/warren/v1/sandboxes/${sandboxId}/secret-grants`,
      { secrets: ["harness-token"] },
      apiKeyB,
    );
    expect(otherTeam.status).toBe(404);
    const badBody = await api("POST", `/warren/v1/sandboxes/${sandboxId}/secret-grants`, { secrets: [] });
    expect(badBody.status).toBe(400);
  }, 120_000);

  it("leaves no trace in a snapshot's files, the ledger, the sandbox's logs or any cluster file once they are gone", async () => {
    const sbx = await Sandbox.connect(sandboxId);
    // A long-running holder, so the snapshot is taken while the secret is live in the sandbox.
    const holder = await WarrenSandbox.connect(sandboxId).then((w) =>
      w.commands.run("sleep 300", { background: true, secrets: ["harness-token"] }),
    );
    const snapshot = (await api("POST", `/sandboxes/${sandboxId}/snapshots`, {}).then((r) => r.json())) as {
      snapshotID: string;
      memory: boolean;
    };
    // Where CRIU works, the snapshot holds the holder's memory, and a process's memory is where its secret lives:
    // only the checkpoint's page images may hold it, on the node and (once the snapshot is durable) as the layer
    // blob in the cluster's store. Files-only (no CRIU on the host): nothing may.
    const holding = filesHolding(value);
    if (snapshot.memory) {
      for (const file of holding)
        expect(file).toMatch(/(\/memory\/pages-\d+\.img|\/store\/blobs\/sha256\/[0-9a-f]{64})$/);
    } else expect(holding).toEqual([]);
    const events = await api("GET", `/warren/v1/sandboxes/${sandboxId}/events`);
    expect(await events.text()).not.toContain(value);
    const logs = await api("GET", `/v2/sandboxes/${sandboxId}/logs`);
    expect(await logs.text()).not.toContain(value);
    await holder.kill();
    await sbx.kill();
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotID)).toBe(true);
    await waitFor(
      "the snapshot's files to go",
      async () => (filesHolding(value).length === 0 ? true : undefined),
      60_000,
    );
  }, 600_000);
});

describe("process leases", () => {
  let sbx: WarrenSandbox;

  beforeAll(async () => {
    sbx = await WarrenSandbox.create();
  }, 120_000);

  async function gone(pid: number): Promise<boolean> {
    return !(await sbx.commands.list()).some((p) => p.pid === pid);
  }

  async function waitGone(pid: number, timeoutMs: number): Promise<number> {
    const started = Date.now();
    while (Date.now() - started < timeoutMs) {
      if (await gone(pid)) return Date.now() - started;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`pid ${pid} still running after ${timeoutMs} ms`);
  }

  it("reaps a process whose lease expires, and list shows the lease until then", async () => {
    const started = Date.now();
    const handle = await sbx.commands.run("sleep 300", { background: true, lease: { ttlMs: 2000 } });
    const listed = (await sbx.commands.list()).find((p) => p.pid === handle.pid);
    expect(listed?.lease).toMatchObject({ ttlMs: 2000, renewals: 0, reaping: false });
    expect(listed?.lease?.remainingMs).toBeLessThanOrEqual(2000);
    await waitGone(handle.pid, 10_000);
    const lived = Date.now() - started;
    expect(lived).toBeGreaterThanOrEqual(1900);
    expect(lived).toBeLessThan(6000);
    await expect(sbx.commands.renewLease(handle.pid)).rejects.toThrow(/no lease/);
  }, 60_000);

  it("every lease, renewal and reap is in the ledger", async () => {
    const handle = await sbx.commands.run("sleep 300", { background: true, lease: { ttlMs: 1500 } });
    await sbx.commands.renewLease(handle.pid);
    await sbx.commands.renewLease(handle.pid);
    await waitGone(handle.pid, 10_000);
    const deadline = Date.now() + 20_000;
    let mine: { type: string; data: Record<string, unknown> }[] = [];
    while (Date.now() < deadline) {
      const res = await api("GET", `/warren/v1/sandboxes/${sbx.sandboxId}/events`);
      const { events } = (await res.json()) as { events: { type: string; data: Record<string, unknown> }[] };
      mine = events.filter((e) => e.type.startsWith("process.lease") && e.data.pid === handle.pid);
      if (mine.some((e) => e.type === "process.lease_reaped")) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    expect(mine.map((e) => e.type)).toEqual([
      "process.lease",
      "process.lease_renewed",
      "process.lease_renewed",
      "process.lease_reaped",
    ]);
    expect(mine[0]?.data).toMatchObject({ ttlMs: 1500 });
    expect(mine[3]?.data).toMatchObject({ signal: "SIGTERM" });
  }, 60_000);

  it("keeps a renewed process, reaps it once renewals stop, and SIGKILLs one that ignores SIGTERM after the grace", async () => {
    const handle = await sbx.commands.run("sleep 300", { background: true, lease: { ttlMs: 1500 } });
    for (let i = 0; i < 8; i++) {
      await new Promise((r) => setTimeout(r, 500));
      const renewed = await sbx.commands.renewLease(handle.pid);
      expect(renewed.renewals).toBe(i + 1);
    }
    expect(await gone(handle.pid)).toBe(false);
    await waitGone(handle.pid, 10_000);

    const stubborn = await sbx.commands.run("trap '' TERM; while :; do sleep 0.1; done", {
      background: true,
      lease: { ttlMs: 500 },
    });
    const ms = await waitGone(stubborn.pid, 20_000);
    // envd's ENVD_LEASE_GRACE_MS default: 5 s between SIGTERM and SIGKILL.
    expect(ms).toBeGreaterThanOrEqual(4500);
    await expect(sbx.commands.run("sleep 1", { lease: { ttlMs: 1000 } })).rejects.toThrow(/background/);
  }, 60_000);

  it("does not count paused time: a lease outlives a pause longer than itself, then is reaped after resume", async () => {
    const clock = "python3 -c 'import time; print(time.monotonic())'";
    const before = Number((await sbx.commands.run(clock)).stdout);
    const handle = await sbx.commands.run("sleep 300", { background: true, lease: { ttlMs: 4000 } });
    const pausedAt = Date.now();
    await sbx.pause();
    await new Promise((r) => setTimeout(r, 6000));
    await WarrenSandbox.connect(sbx.sandboxId);
    const pausedMs = Date.now() - pausedAt;
    const after = Number((await sbx.commands.run(clock)).stdout);
    // CLOCK_MONOTONIC inside the sandbox kept running while the freezer held it (printed for the README).
    console.log(`paused ${pausedMs} ms; CLOCK_MONOTONIC advanced ${Math.round((after - before) * 1000)} ms`);
    expect((after - before) * 1000).toBeGreaterThan(5000);
    const lease = (await sbx.commands.list()).find((p) => p.pid === handle.pid)?.lease;
    expect(lease).toBeDefined();
    expect(lease?.remainingMs).toBeGreaterThan(0);
    await waitGone(handle.pid, 10_000);
    await sbx.kill();
  }, 120_000);
});
