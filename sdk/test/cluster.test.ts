import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CommandExitError, Sandbox, SandboxNotFoundError, type SnapshotInfo } from "../src/index.js";

// Warren's SDK against a whole Warren cluster (api, master, node agent, proxy as separate processes):
// the REST methods and the event ledger for real, not against a recording server.
const dataDir = mkdtempSync(join(tmpdir(), "warren-sdk-cluster-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "sc",
  nodeCidr: () => "10.218.0.0/22",
});
let opts: { apiKey: string; apiUrl: string; sandboxUrl: string };

beforeAll(async () => {
  const env = await cluster.start();
  opts = { apiKey: env.WARREN_API_KEY, apiUrl: env.WARREN_API_URL, sandboxUrl: env.WARREN_PROXY_URL };
}, 600_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("Warren's SDK against a whole cluster", () => {
  it("creates, lists, inspects, times out, pauses, resumes and kills through the real api", async () => {
    const sandbox = await Sandbox.create({ ...opts, metadata: { suite: "sdk-cluster" } });
    try {
      expect((await sandbox.commands.run("id -un")).stdout).toBe("user\n");
      await expect(sandbox.commands.run("exit 7")).rejects.toBeInstanceOf(CommandExitError);

      const info = await Sandbox.getInfo(sandbox.sandboxId, opts);
      expect(info.sandboxId).toBe(sandbox.sandboxId);
      expect(info.metadata).toEqual({ suite: "sdk-cluster" });
      const listed = await Sandbox.list({ ...opts, query: { metadata: { suite: "sdk-cluster" } } }).nextItems();
      expect(listed.map((s) => s.sandboxId)).toEqual([sandbox.sandboxId]);

      await sandbox.setTimeout(120_000);
      const endAt = (await Sandbox.getInfo(sandbox.sandboxId, opts)).endAt.getTime();
      expect(endAt).toBeGreaterThan(Date.now() + 100_000);

      await sandbox.files.write("kept.txt", "across pause");
      expect(await sandbox.pause()).toBe(true);
      expect(await sandbox.isRunning()).toBe(false);
      const resumed = await Sandbox.connect(sandbox.sandboxId, opts);
      expect(await resumed.files.read("kept.txt")).toBe("across pause");
    } finally {
      expect(await Sandbox.kill(sandbox.sandboxId, opts)).toBe(true);
    }
    expect(await Sandbox.kill(sandbox.sandboxId, opts)).toBe(false);
    await expect(Sandbox.connect(sandbox.sandboxId, opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
  });

  it("reads the sandbox's event ledger from the real api, by cursor", async () => {
    const sandbox = await Sandbox.create(opts);
    await sandbox.kill();
    const events = [];
    for await (const event of sandbox.events()) events.push(event);
    expect(events.map((e) => e.type)).toEqual(["sandbox.created", "sandbox.started", "sandbox.killed"]);
    const rest = [];
    for await (const event of sandbox.events({ cursor: events[0]?.id })) rest.push(event.type);
    expect(rest).toEqual(["sandbox.started", "sandbox.killed"]);
  });

  it("retrying a create with the same Idempotency-Key returns the same sandbox", async () => {
    const key = `sdk-cluster-${Date.now()}`;
    const headers = { "X-API-KEY": opts.apiKey, "Content-Type": "application/json", "Idempotency-Key": key };
    const body = JSON.stringify({ templateID: "base", timeout: 60 });
    const first = await fetch(`${opts.apiUrl}/v2/sandboxes`, { method: "POST", headers, body });
    const second = await fetch(`${opts.apiUrl}/v2/sandboxes`, { method: "POST", headers, body });
    const a = (await first.json()) as { sandboxID: string };
    const b = (await second.json()) as { sandboxID: string };
    expect(b.sandboxID).toBe(a.sandboxID);
    expect(await Sandbox.kill(a.sandboxID, opts)).toBe(true);
  });

  it("snapshots: create, list by sandbox and by name in pages, create from one, fork two, delete", async () => {
    const source = await Sandbox.create({ ...opts, timeoutMs: 300_000 });
    const made: Sandbox[] = [source];
    try {
      await source.files.write("snap.txt", "from the source");
      const name = `sdk-snap-${source.sandboxId.slice(0, 8)}`;
      const named = await source.createSnapshot({ name });
      expect(named.snapshotId).toMatch(new RegExp(`/${name}:default$`));
      expect(named.names).toEqual([named.snapshotId]);
      expect(typeof named.memory).toBe("boolean");
      expect(named.sizeBytes).toBeGreaterThanOrEqual(0);
      const unnamed = await Sandbox.createSnapshot(source.sandboxId, opts);
      expect(unnamed.names).toEqual([]);

      // By sandbox, one a page: newest first, then the next page, then no more.
      const paginator = source.listSnapshots({ limit: 1 });
      const pages: SnapshotInfo[][] = [];
      while (paginator.hasNext) pages.push(await paginator.nextItems());
      expect(pages.map((p) => p.map((s) => s.snapshotId))).toEqual([[unnamed.snapshotId], [named.snapshotId]]);
      expect(pages[1]?.[0]).toMatchObject({ sandboxId: source.sandboxId, memory: named.memory });
      expect(pages[1]?.[0]?.createdAt).toBeInstanceOf(Date);
      const byName = await Sandbox.listSnapshots({ ...opts, name }).nextItems();
      expect(byName.map((s) => s.snapshotId)).toEqual([named.snapshotId]);

      const child = await Sandbox.create(named.snapshotId, { ...opts, timeoutMs: 120_000 });
      made.push(child);
      expect(await child.files.read("snap.txt")).toBe("from the source");

      const forks = await source.fork({ count: 2, timeoutMs: 120_000 });
      expect(forks).toHaveLength(2);
      const [a, b] = forks;
      if (!(a instanceof Sandbox) || !(b instanceof Sandbox)) throw new Error(`a fork failed: ${forks.join(", ")}`);
      made.push(a, b);
      expect(new Set([a.sandboxId, b.sandboxId, source.sandboxId]).size).toBe(3);
      await a.files.write("only-a.txt", "a");
      await b.files.write("snap.txt", "changed in b");
      expect(await a.files.read("snap.txt")).toBe("from the source");
      expect(await b.files.exists("only-a.txt")).toBe(false);
      expect(await source.files.exists("only-a.txt")).toBe(false);
      expect(await source.files.read("snap.txt")).toBe("from the source");

      expect(await Sandbox.deleteSnapshot(named.snapshotId, opts)).toBe(true);
      expect(await Sandbox.deleteSnapshot(named.snapshotId, opts)).toBe(false);
      expect(await Sandbox.deleteSnapshot(unnamed.snapshotId, opts)).toBe(true);
      expect(await source.listSnapshots().nextItems()).toEqual([]);
      expect(await child.files.read("snap.txt")).toBe("from the source");
    } finally {
      await Promise.all(made.map((s) => s.kill()));
    }
  });

  it("snapshot and fork of an unknown sandbox throw SandboxNotFoundError", async () => {
    await expect(Sandbox.createSnapshot("nosuchsandbox", opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(Sandbox.fork("nosuchsandbox", opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
  });
});
