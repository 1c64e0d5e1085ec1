import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkpointTier } from "../src/host-capabilities.js";

// Snapshots, forks and moving a paused sandbox to another node, through the whole cluster (two namespace node
// agents on this host), driven by the official e2b SDK.
// The namespace driver keeps a snapshot's files as overlayfs layers on the node's disk, and its processes as a
// CRIU dump where CRIU works on the host (the checkpoint tier): then sandboxes made from it continue the source's
// processes; elsewhere they boot fresh over its files. The tests assert whichever the host does.
const dataDir = mkdtempSync(join(tmpdir(), "warren-snap-"));

/** The master's log lines about moving `sandboxId` (why a move did not happen, when a test expected one). */
function moveLog(sandboxId: string): string {
  // The master's own process, or the one it shares with the api (LocalCluster's default).
  const log = ["master.log", "api-master.log"].map((name) => join(dataDir, "logs", name)).find(existsSync);
  if (!log) return "no master log";
  const lines = readFileSync(log, "utf8")
    .split("\n")
    .filter((line) => line.includes(sandboxId) && /mov|relocat|resum/i.test(line));
  return `the master's log about ${sandboxId}:\n${lines.join("\n") || "(nothing)"}`;
}
const agentStates = [join(dataDir, "agent-ka"), join(dataDir, "agent-kb")];
let cluster: LocalCluster;
const created: Sandbox[] = [];

beforeAll(async () => {
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 2,
    poolSize: 1,
    instancePrefix: "k",
    nodeCidr: (i) => `10.222.${i * 4}.0/22`,
  });
  const env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster?.stop();
  if (!process.env.WARREN_E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

/** The command lines of the processes in a sandbox's workload cgroup (memory hierarchy, cgroup v1). */
function workloadCommands(sandboxId: string): string[] {
  for (const agent of ["ka", "kb"]) {
    const root = join(dataDir, `agent-${agent}`, "instances");
    for (const instanceId of existsSync(root) ? readdirSync(root) : []) {
      const file = join(root, instanceId, "instance.json");
      if (!existsSync(file)) continue;
      const record = JSON.parse(readFileSync(file, "utf8")) as { labels: Record<string, string> };
      if (record.labels.sandboxId !== sandboxId) continue;
      return readFileSync(`/sys/fs/cgroup/memory/warren/${agent}/${instanceId}/workload/cgroup.procs`, "utf8")
        .split("\n")
        .filter(Boolean)
        .flatMap((pid) => {
          // A process that ended between the two reads (the shell of a command that just ran) is gone.
          try {
            return [readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").trim()];
          } catch {
            return [];
          }
        });
    }
  }
  throw new Error(`no instance of sandbox '${sandboxId}'`);
}

async function sandbox(template = "base", opts: Parameters<typeof Sandbox.create>[1] = {}): Promise<Sandbox> {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000, ...opts });
  created.push(sbx);
  return sbx;
}

const run = async (sbx: Sandbox, cmd: string) => (await sbx.commands.run(cmd, { user: "root" })).stdout.trim();

/** Writes that exercise every kind of entry an overlay upper layer holds: files, whiteouts, opaque dirs. */
async function shapeFilesystem(sbx: Sandbox): Promise<void> {
  await sbx.files.write("/home/user/notes.txt", "written before the snapshot");
  await run(sbx, "rm /etc/issue && rm -rf /etc/apt && mkdir /etc/apt && echo new > /etc/apt/only");
  await run(sbx, "dd if=/dev/urandom of=/opt/blob bs=1M count=4 status=none && sha256sum /opt/blob > /opt/blob.sum");
}

async function assertShaped(sbx: Sandbox): Promise<void> {
  expect(await sbx.files.read("/home/user/notes.txt")).toBe("written before the snapshot");
  expect(await run(sbx, "test -e /etc/issue && echo present || echo gone")).toBe("gone");
  expect(await run(sbx, "ls /etc/apt")).toBe("only");
  expect(await run(sbx, "sha256sum -c /opt/blob.sum >/dev/null && echo intact")).toBe("intact");
  // The file's owner is the sandbox's user, as it was written.
  expect(await run(sbx, "stat -c %U /home/user/notes.txt")).toBe("user");
}

function layerDirs(): string[] {
  return agentStates.flatMap((state) => {
    const dir = join(state, "layers");
    return existsSync(dir) ? readdirSync(dir).filter((name) => !name.startsWith(".")) : [];
  });
}

/** The layers the snapshots kept on the nodes stack (their descriptions' `layers`), sorted. */
function snapshotLayerNames(): string[] {
  const names = new Set<string>();
  for (const state of agentStates) {
    const dir = join(state, "snapshots");
    for (const id of existsSync(dir) ? readdirSync(dir).filter((name) => !name.startsWith(".")) : []) {
      const file = join(dir, id, "snapshot.json");
      if (!existsSync(file)) continue;
      for (const layer of (JSON.parse(readFileSync(file, "utf8")) as { layers: string[] }).layers) {
        names.add(layer.split("/").at(-1) ?? "");
      }
    }
  }
  return [...names].sort();
}

/** The node a sandbox runs on, as its route in Redis says. */
async function nodeOf(sandboxId: string): Promise<string> {
  const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
  try {
    return (await redis.hget(`warren:route:${sandboxId}`, "node")) ?? "";
  } finally {
    redis.disconnect();
  }
}

async function admin(method: string, path: string): Promise<number> {
  const res = await fetch(`${cluster.env.WARREN_API_URL}${path}`, {
    method,
    headers: { "X-Admin-Token": cluster.env.WARREN_ADMIN_TOKEN },
  });
  return res.status;
}

function mountsOf(path: string): string[] {
  return readFileSync("/proc/mounts", "utf8")
    .split("\n")
    .filter((line) => line.includes(path));
}

describe("snapshots and fork (official e2b SDK, namespace node)", () => {
  let source: Sandbox;
  let sleepPid: number;
  let snapshotId: string;

  beforeAll(async () => {
    source = await sandbox("base", { envs: { FROM: "source" } });
    await shapeFilesystem(source);
    sleepPid = (await source.commands.run("sleep 3600", { background: true })).pid;
  }, 120_000);

  it("createSnapshot keeps the source running, same processes; a sandbox made from it has its files", async () => {
    const bootBefore = await run(source, "cat /proc/sys/kernel/random/boot_id");
    const info = await source.createSnapshot({ name: "shaped" });
    snapshotId = info.snapshotId;
    expect(info.names).toEqual([info.snapshotId]);
    expect(info.snapshotId).toMatch(/\/shaped:default$/);
    expect((await source.commands.list()).map((p) => p.pid)).toContain(sleepPid);
    expect(await run(source, "cat /proc/sys/kernel/random/boot_id")).toBe(bootBefore);
    expect((await source.getInfo()).state).toBe("running");

    const child = await sandbox(info.snapshotId);
    await assertShaped(child);
    expect(await run(child, "echo $FROM")).toBe("source");
    if (checkpointTier().usable) {
      // With memory: the source's processes continue in the child (same pid, same boot), under its own token.
      expect(await run(child, "cat /proc/sys/kernel/random/boot_id")).toBe(bootBefore);
      expect((await child.commands.list()).map((p) => p.pid)).toContain(sleepPid);
      expect(await run(child, `cat /proc/${sleepPid}/cmdline | tr '\\0' ' '`)).toBe("sleep 3600");
      expect(child.sandboxId).not.toBe(source.sandboxId);
      // The restored envd still puts what it starts, as `user` too, in the child's own workload cgroup: CRIU handed
      // it the workload's descriptor as the launcher opened it (host root), not reopened with the sandbox's creds.
      await child.commands.run("sleep 777", { background: true });
      // (Its shell, or the sleep the shell became; envd moves it there a moment after the spawn.)
      const joined = async () => {
        for (const deadline = Date.now() + 10_000; Date.now() < deadline; ) {
          if (workloadCommands(child.sandboxId).some((line) => line.endsWith("sleep 777"))) return true;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        return false;
      };
      expect(await joined()).toBe(true);
      expect(workloadCommands(child.sandboxId)).toContain("sleep 3600");
    } else {
      // Files only: a fresh boot (new boot id, none of the source's processes).
      expect(await run(child, "cat /proc/sys/kernel/random/boot_id")).not.toBe(bootBefore);
      expect((await child.commands.list()).map((p) => p.cmd)).not.toContain("sleep");
    }
  });

  it("two sandboxes from one snapshot and the source are independent of each other", async () => {
    const [a, b] = await Promise.all([sandbox(snapshotId), sandbox("shaped")]);
    if (!a || !b) throw new Error("no sandboxes");
    await a.files.write("/home/user/only-a", "a");
    await b.files.write("/home/user/notes.txt", "changed in b");
    await source.files.write("/home/user/only-source", "s");
    expect(await run(a, "ls /home/user")).not.toContain("only-source");
    expect(await run(b, "ls /home/user")).not.toContain("only-a");
    expect(await a.files.read("/home/user/notes.txt")).toBe("written before the snapshot");
    expect(await source.files.read("/home/user/notes.txt")).toBe("written before the snapshot");
    expect(await run(source, "ls /home/user")).not.toContain("only-a");
  });

  it("listSnapshots finds it globally, by sandbox and by name", async () => {
    const all = await Sandbox.listSnapshots().nextItems();
    expect(all.map((s) => s.snapshotId)).toContain(snapshotId);
    const bySandbox = await Sandbox.listSnapshots({ sandboxId: source.sandboxId }).nextItems();
    expect(bySandbox.map((s) => s.snapshotId)).toEqual([snapshotId]);
    const byName = await Sandbox.listSnapshots({ name: "shaped" }).nextItems();
    expect(byName).toEqual([{ snapshotId, names: [snapshotId] }]);
    expect(await Sandbox.listSnapshots({ name: "nothing-by-this-name" }).nextItems()).toEqual([]);
  });

  it("a snapshot of a paused sandbox leaves it paused; resume brings back its processes", async () => {
    const paused = await sandbox();
    const pid = (await paused.commands.run("sleep 3600", { background: true })).pid;
    await paused.files.write("/home/user/paused.txt", "from a paused sandbox");
    await paused.pause();
    const info = await Sandbox.createSnapshot(paused.sandboxId);
    expect(info.names).toEqual([]);
    expect((await paused.getInfo()).state).toBe("paused");
    const child = await sandbox(info.snapshotId);
    expect(await child.files.read("/home/user/paused.txt")).toBe("from a paused sandbox");
    await paused.connect();
    expect((await paused.commands.list()).map((p) => p.pid)).toContain(pid);
  });

  it("fork: count 2 independent copies of the files; the source keeps its id, processes and endAt", async () => {
    const endAtBefore = (await source.getInfo()).endAt;
    const forks = await source.fork({ count: 2, timeoutMs: 120_000 });
    expect(forks).toHaveLength(2);
    const [f1, f2] = forks.map((f) => {
      if (!(f instanceof Sandbox)) throw f;
      created.push(f);
      return f;
    });
    if (!f1 || !f2) throw new Error("no forks");
    expect(f1.sandboxId).not.toBe(f2.sandboxId);
    expect(f1.sandboxId).not.toBe(source.sandboxId);
    await assertShaped(f1);
    await f1.files.write("/home/user/only-f1", "1");
    expect(await run(f2, "ls /home/user")).not.toContain("only-f1");
    expect(await run(source, "ls /home/user")).not.toContain("only-f1");
    expect(await run(f2, "echo $FROM")).toBe("source");
    if (checkpointTier().usable) {
      for (const f of [f1, f2]) expect((await f.commands.list()).map((p) => p.pid)).toContain(sleepPid);
    }
    expect((await source.getInfo()).endAt).toEqual(endAtBefore);
    expect((await source.commands.list()).map((p) => p.pid)).toContain(sleepPid);
    // A fork's capture is not a listed snapshot.
    const bySandbox = await Sandbox.listSnapshots({ sandboxId: source.sandboxId }).nextItems();
    expect(bySandbox.map((s) => s.snapshotId)).toEqual([snapshotId]);
    // Killed source: fork is 404 → SandboxNotFoundError.
    const doomed = await sandbox();
    await doomed.kill();
    await expect(Sandbox.fork(doomed.sandboxId)).rejects.toThrow(/not found|doesn't exist/i);
  });

  it("deleteSnapshot: sandboxes made from it keep working; no template by that id; files go with the last user", async () => {
    const user = await sandbox(snapshotId);
    expect(await Sandbox.deleteSnapshot(snapshotId)).toBe(true);
    expect(await Sandbox.deleteSnapshot(snapshotId)).toBe(false);
    await expect(Sandbox.create(snapshotId)).rejects.toThrow();
    await assertShaped(user);
    expect(layerDirs().length).toBeGreaterThan(0);

    await Promise.all(created.splice(0).map((s) => s.kill().catch(() => undefined)));
    await source.kill().catch(() => undefined);
    // The last sandbox stacking each layer is gone: so are the layers, and every mount of those sandboxes. The
    // "paused" test's snapshot is still listed: its layers stay (one, or two when a durable capture of the paused
    // sandbox came first and the snapshot's layer is that capture's increment).
    const left = await (async () => {
      const deadline = Date.now() + 25_000;
      for (;;) {
        const remaining = layerDirs().sort();
        if (remaining.join() === snapshotLayerNames().join() || Date.now() > deadline) return remaining;
        await new Promise((r) => setTimeout(r, 200));
      }
    })();
    expect(left).toEqual(snapshotLayerNames());
    expect(left.length).toBeGreaterThan(0);
    const remaining = await Sandbox.listSnapshots().nextItems();
    expect(remaining).toHaveLength(1);
    expect(await Sandbox.deleteSnapshot(remaining[0]?.snapshotId ?? "")).toBe(true);
    // What is left is only what a snapshot still on a node stacks: a paused sandbox's durable capture lingers
    // there (hidden, swept by the leader later) and may share the deleted snapshot's lower layer.
    expect(layerDirs().sort()).toEqual(snapshotLayerNames());
    // A kill answers once the sandbox is unreachable and its processes are dead; its node unmounts its root in the
    // background (the driver's reclaim), so the mounts are waited for, not expected at once.
    const mounted = async () => {
      const deadline = Date.now() + 30_000;
      for (;;) {
        const mounts = agentStates.flatMap((state) => mountsOf(join(state, "layers")));
        if (mounts.length === 0 || Date.now() > deadline) return mounts;
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    expect(await mounted()).toEqual([]);
  }, 90_000);
});

describe("resume on another node (official e2b SDK, two namespace nodes)", () => {
  it("a filesystem-only paused sandbox on a cordoned node resumes on the other one with its files", async () => {
    const sbx = await sandbox("base", { envs: { WHO: "mover" } });
    await shapeFilesystem(sbx);
    const from = await nodeOf(sbx.sandboxId);
    expect(from).toMatch(/^node-k[ab]$/);
    await sbx.pause({ keepMemory: false });
    expect(await admin("POST", `/warren/v1/admin/nodes/${from}/cordon`)).toBe(204);
    try {
      await sbx.connect();
      const to = await nodeOf(sbx.sandboxId);
      expect(to).toMatch(/^node-k[ab]$/);
      expect(to, moveLog(sbx.sandboxId)).not.toBe(from);
      // The same sandbox (id, token: the SDK object keeps working), its files, a fresh boot on the new node.
      await assertShaped(sbx);
      expect(await run(sbx, "echo $WHO")).toBe("mover");
      await sbx.files.write("/home/user/after-move", "ok");
      expect(await sbx.files.read("/home/user/after-move")).toBe("ok");
      // Nothing of it is left on the old node: no instance, no layer the move made.
      const oldState = agentStates.find((state) => state.endsWith(from.slice("node-".length)));
      const instances = readdirSync(join(oldState ?? "", "instances"));
      for (const instance of instances) {
        // A directory without its record is a killed instance whose reclaim is still under way.
        const file = join(oldState ?? "", "instances", instance, "instance.json");
        if (!existsSync(file)) continue;
        const record = JSON.parse(readFileSync(file, "utf8"));
        expect(record.labels?.sandboxId).not.toBe(sbx.sandboxId);
      }
    } finally {
      expect(await admin("DELETE", `/warren/v1/admin/nodes/${from}/cordon`)).toBe(204);
    }
    await sbx.kill();
    // The move's layers went with the sandbox (collected once its reclaim, right after the kill, is over); any left
    // are what snapshots still on the nodes stack.
    const layersSettled = async () => {
      for (let i = 0; i < 100; i++) {
        if (JSON.stringify(layerDirs().sort()) === JSON.stringify(snapshotLayerNames())) return;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    };
    await layersSettled();
    expect(layerDirs().sort()).toEqual(snapshotLayerNames());
  });

  it("a sandbox paused with its memory moves with its processes where CRIU works, else resumes in place", async () => {
    const sbx = await sandbox();
    const pid = (await sbx.commands.run("sleep 3600", { background: true })).pid;
    await sbx.files.write("/home/user/kept", "yes");
    const from = await nodeOf(sbx.sandboxId);
    await sbx.pause();
    expect(await admin("POST", `/warren/v1/admin/nodes/${from}/cordon`)).toBe(204);
    try {
      await sbx.connect();
      const to = await nodeOf(sbx.sandboxId);
      if (checkpointTier().usable) expect(to, moveLog(sbx.sandboxId)).not.toBe(from);
      else expect(to).toBe(from);
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(pid);
      expect(await sbx.files.read("/home/user/kept")).toBe("yes");
    } finally {
      expect(await admin("DELETE", `/warren/v1/admin/nodes/${from}/cordon`)).toBe(204);
    }
    await sbx.kill();
  });

  it("a snapshot survives its node agent's crash: the restarted agent starts sandboxes from it", async () => {
    const sbx = await sandbox();
    await sbx.files.write("/home/user/survivor.txt", "still here");
    const info = await sbx.createSnapshot({ name: "survivor" });
    const index = (await nodeOf(sbx.sandboxId)) === "node-ka" ? 0 : 1;
    await cluster.killNodeAgent(index);
    cluster.startNodeAgent(index);
    const deadline = Date.now() + 120_000;
    let child: Sandbox | undefined;
    while (!child) {
      child = await sandbox(info.snapshotId).catch((error) => {
        if (Date.now() > deadline) throw error;
        return undefined;
      });
      if (!child) await new Promise((r) => setTimeout(r, 500));
    }
    expect(await child.files.read("/home/user/survivor.txt")).toBe("still here");
    expect(await Sandbox.deleteSnapshot(info.snapshotId)).toBe(true);
  }, 180_000);
});
