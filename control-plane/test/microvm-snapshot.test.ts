import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import type { Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { initEnvd } from "../src/node-agent/envd-client.js";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import type { Instance } from "../src/runtime/driver.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { saveMemory } from "../src/runtime/microvm/qemu-migration.js";
import { withQmp } from "../src/runtime/microvm/qmp.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { type BuiltTemplate, TemplateStore } from "../src/templates/store.js";
import { MEMORY_PROCESS, reportMemory } from "./memory-process.js";
import { BUILD_TIMEOUT_MS, sdkSandbox, testConfig } from "./node-agent-harness.js";

// The microvm driver's sandbox snapshots, driven directly (no node agent), under TCG (CI has no real KVM). The
// first run on a machine builds the `base` template, its guest root image and template snapshot (cached after).
// 10.238.4.0/22: microvm-lifecycle.test.ts's failing-create driver uses 10.238.0.0/24.
const config = testConfig({ instance: "ms", cidr: "10.238.4.0/22", extraEnv: { WARREN_DRIVER: "microvm-tcg" } });
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
const TOKEN = "token-ms-source";
let driver: MicrovmDriver;
let template: BuiltTemplate;

/** `start`: prepare the host (firewall chains); a driver that only reads its state dir needs none of it. */
async function newDriver(start = true): Promise<MicrovmDriver> {
  const { probe, microvm } = await selectRuntime(config, log);
  expect(probe.driver).toBe("microvm-tcg");
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  if (start) await microvm.start();
  return microvm;
}

/** Whatever a failed run left of this tag: instances (re-adopted, then killed) and snapshots. */
async function purge(d: MicrovmDriver): Promise<void> {
  const { adopted } = await d.reconcile();
  for (const instance of adopted) await d.kill(instance.instanceId);
  for (const snapshot of await d.listSnapshots()) await d.deleteSnapshot(snapshot.snapshotId);
}

/** Everything of this tag on the host: QEMU processes, namespaces, veths, instance and snapshot directories. */
function footprint(): Record<string, string[]> {
  const list = (dir: string, prefix = "") =>
    existsSync(dir) ? readdirSync(dir).filter((n) => n.startsWith(prefix)) : [];
  const qemus = list("/proc").filter((pid) => {
    if (!/^\d+$/.test(pid)) return false;
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      return cmdline.includes(`${config.stateDir}/`) && !stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
    } catch {
      return false;
    }
  });
  return {
    qemus,
    netns: list("/run/netns", `warren-${config.instance}-`),
    veths: list("/sys/class/net", `wv-${config.instance}-`),
    instances: list(`${config.stateDir}/instances`),
    snapshots: list(`${config.stateDir}/sandbox-snapshots`),
  };
}
const NOTHING = { qemus: [], netns: [], veths: [], instances: [], snapshots: [] };

const sdkOf = (instance: Instance): Sandbox => sdkSandbox(instance.instanceId, instance.envdUrl, TOKEN);

async function sh(sandbox: Sandbox, command: string): Promise<string> {
  return (await sandbox.commands.run(command, { timeoutMs: 60_000 })).stdout.trim();
}

async function envdSilent(instance: Instance): Promise<boolean> {
  return fetch(`${instance.envdUrl}/health`, { signal: AbortSignal.timeout(1500) }).then(
    () => false,
    () => true,
  );
}

let source: Instance;
let pid: number;
let before: { secret: string; count: number };
const forks: Instance[] = [];

beforeAll(async () => {
  driver = await newDriver();
  await purge(driver);
  const templates = new TemplateStore({ dir: config.templatesDir, uidBase: config.uidBase, log });
  template = await templates.ensure("base", async (image) => {
    const instance = await driver.create({ template: image, resources: templates.recipe("base").defaults });
    await driver.kill(instance.instanceId);
  });
  await driver.ensureSnapshot(template, template.recipe.defaults);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  if (driver) await purge(driver);
}, 120_000);

describe("microvm driver snapshots (QEMU microvm, TCG)", () => {
  it("a snapshot of a running sandbox: the source runs on with the same process; it is listed, also by a new driver", async () => {
    source = await driver.create({ template, resources: template.recipe.defaults });
    await initEnvd(source.envdUrl, {
      envVars: {},
      accessToken: TOKEN,
      defaultUser: "user",
      defaultWorkdir: "/home/user",
    });
    const sandbox = sdkOf(source);
    await sandbox.files.write("/home/user/state.txt", "from the source");
    pid = (await sandbox.commands.run(MEMORY_PROCESS, { background: true, timeoutMs: 0 })).pid;
    before = await reportMemory(sandbox, pid);

    const image = await driver.snapshot(source.instanceId, "ms-run");
    expect(image).toMatchObject({
      snapshotId: "ms-run",
      driver: "microvm-tcg",
      templateId: "base",
      templateHash: template.hash,
      memory: true,
      resources: template.recipe.defaults,
    });
    expect(image.sizeBytes).toBeGreaterThan(0);
    expect(driver.list().find((i) => i.instanceId === source.instanceId)?.paused).toBe(false);
    const after = await reportMemory(sandbox, pid);
    expect(after.secret).toBe(before.secret);
    expect(after.count).toBeGreaterThanOrEqual(before.count);

    await expect(driver.snapshot(source.instanceId, "ms-run")).rejects.toThrow("snapshot 'ms-run' already exists");
    await expect(driver.snapshot(source.instanceId, "../escape")).rejects.toThrow("invalid snapshot id '../escape'");
    expect((await reportMemory(sandbox, pid)).secret).toBe(before.secret);

    expect((await driver.listSnapshots()).map((s) => s.snapshotId)).toEqual(["ms-run"]);
    // From disk: what an agent restarted now would see; its reconcile keeps the snapshot.
    const restarted = await newDriver(false);
    expect((await restarted.reconcile()).adopted.map((i) => i.instanceId)).toEqual([source.instanceId]);
    expect(await restarted.listSnapshots()).toEqual([image]);
  }, 120_000);

  it("two instances from the snapshot continue its process (same pid, same memory) and files, independently", async () => {
    const other = { ...template.recipe.defaults, memoryMB: template.recipe.defaults.memoryMB * 2 };
    await expect(driver.create({ template, resources: other, snapshotId: "ms-run" })).rejects.toThrow(
      /snapshot 'ms-run' holds a running guest of \d+ MiB and 1 vCPU\(s\); it cannot start with \d+ MiB/,
    );
    expect(footprint().instances).toEqual([source.instanceId]);
    for (let i = 0; i < 2; i++) {
      forks.push(await driver.create({ template, resources: template.recipe.defaults, snapshotId: "ms-run" }));
    }
    expect(new Set([source, ...forks].map((i) => i.addr)).size).toBe(3);
    for (const fork of forks) {
      const sandbox = sdkOf(fork);
      expect(await sandbox.files.read("/home/user/state.txt")).toBe("from the source");
      expect(await sh(sandbox, `tr '\\0' ' ' < /proc/${pid}/cmdline`)).toContain("while :; do n=$((n+1))");
      const state = await reportMemory(sandbox, pid);
      expect(state.secret).toBe(before.secret);
      expect(state.count).toBeGreaterThanOrEqual(before.count);
    }
    const [a, b] = forks.map(sdkOf);
    await a!.files.write("/home/user/only-a.txt", "written in fork a");
    expect(await b!.files.exists("/home/user/only-a.txt")).toBe(false);
    expect(await sdkOf(source).files.exists("/home/user/only-a.txt")).toBe(false);
    await b!.files.write("/home/user/state.txt", "changed in fork b");
    expect(await a!.files.read("/home/user/state.txt")).toBe("from the source");
    expect(await sdkOf(source).files.read("/home/user/state.txt")).toBe("from the source");
  }, 180_000);

  it("a snapshot of a paused (QMP-stopped) sandbox leaves it paused; it checkpoints, is snapshotted again from disk, and resumes", async () => {
    const a = forks[0]!;
    await driver.pause(a.instanceId);
    const image = await driver.snapshot(a.instanceId, "ms-paused");
    expect(image.memory).toBe(true);
    expect(driver.list().find((i) => i.instanceId === a.instanceId)?.paused).toBe(true);
    expect(await envdSilent(a)).toBe(true);
    // Again while still paused (QEMU is in `postmigrate` now); unused, deleting it removes it at once.
    expect((await driver.snapshot(a.instanceId, "ms-paused-again")).memory).toBe(true);
    await driver.deleteSnapshot("ms-paused-again");
    expect(footprint().snapshots.sort()).toEqual(["ms-paused", "ms-run"]);
    expect(await envdSilent(a)).toBe(true);
    // QEMU cannot migrate a second time after the snapshot's migration; the checkpoint reuses its memory image.
    await driver.checkpoint(a.instanceId);
    // Checkpointed to disk (no QEMU): its memory file is shared with the snapshot, which outlives its removal.
    expect((await driver.snapshot(a.instanceId, "ms-checkpointed")).memory).toBe(true);
    expect(await driver.resume(a.instanceId)).toEqual({ tier: "checkpoint" });
    expect(statSync(`${config.stateDir}/sandbox-snapshots/ms-checkpointed/memory.snap`).size).toBeGreaterThan(0);
    await driver.deleteSnapshot("ms-checkpointed");
    const state = await reportMemory(sdkOf(a), pid);
    expect(state.secret).toBe(before.secret);
  }, 360_000);

  it("a snapshot of a stopped sandbox holds files only; an instance from it boots fresh over them", async () => {
    const b = forks[1]!;
    await driver.pause(b.instanceId);
    await driver.stop(b.instanceId);
    const image = await driver.snapshot(b.instanceId, "ms-files");
    expect(image.memory).toBe(false);
    await driver.kill(b.instanceId);
    forks.splice(1, 1);
    // Files only: any memory size will do.
    const resources = { ...template.recipe.defaults, memoryMB: 384 };
    const d = await driver.create({ template, resources, snapshotId: "ms-files" });
    forks.push(d);
    await initEnvd(d.envdUrl, { envVars: {}, accessToken: TOKEN, defaultUser: "user", defaultWorkdir: "/home/user" });
    const sandbox = sdkOf(d);
    expect(await sandbox.files.read("/home/user/state.txt")).toBe("changed in fork b");
    // A fresh boot: the source's process is not there (its pid may be another process's now).
    expect(await sh(sandbox, `tr '\\0' ' ' < /proc/${pid}/cmdline 2>/dev/null; true`)).not.toContain("n=$((n+1))");
    await driver.deleteSnapshot("ms-files");
    await driver.kill(d.instanceId);
    forks.pop();
    expect(footprint().snapshots.sort()).toEqual(["ms-paused", "ms-run"]);
  }, 600_000);

  it("deleteSnapshot while instances from it run: they keep working (also from a new QEMU); killing them removes its files", async () => {
    await driver.kill(source.instanceId);
    // ms-paused (a fork's snapshot) is layered on ms-run's disk; deleting both while instances use them.
    const c = await driver.create({ template, resources: template.recipe.defaults, snapshotId: "ms-paused" });
    forks.push(c);
    await driver.deleteSnapshot("ms-run");
    await driver.deleteSnapshot("ms-paused");
    await driver.deleteSnapshot("ms-paused");
    await driver.deleteSnapshot("ms-never-made");
    expect(await driver.listSnapshots()).toEqual([]);
    // An agent restarted now: its reconcile keeps the files the running instances are layered on.
    await (await newDriver(false)).reconcile();
    expect(footprint().snapshots.sort()).toEqual(["ms-paused", "ms-run"]);
    await expect(
      driver.create({ template, resources: template.recipe.defaults, snapshotId: "ms-run" }),
    ).rejects.toThrow(/'ms-run'/);

    // A new QEMU opens c's disk chain by path: c → ms-paused → ms-run → the template snapshot.
    await driver.pause(c.instanceId);
    await driver.checkpoint(c.instanceId);
    await driver.resume(c.instanceId);
    const sandbox = sdkOf(c);
    expect(await sandbox.files.read("/home/user/only-a.txt")).toBe("written in fork a");
    expect(await sandbox.files.read("/home/user/state.txt")).toBe("from the source");
    expect(await sh(sandbox, "echo still works")).toBe("still works");
    expect((await reportMemory(sandbox, pid)).secret).toBe(before.secret);

    // The source and both forks of ms-run gone: c still needs ms-run's disk (through ms-paused's).
    await driver.kill(forks.shift()!.instanceId);
    expect(footprint().snapshots.sort()).toEqual(["ms-paused", "ms-run"]);
    await driver.kill(c.instanceId);
    forks.length = 0;
    expect(footprint()).toEqual(NOTHING);
  }, 240_000);

  it("an agent restarted in the middle of a running instance's snapshot: reconcile lets the instance run on", async () => {
    const e = await driver.create({ template, resources: template.recipe.defaults });
    const dir = driver.instanceDir(e.instanceId);
    // What the driver had done when the agent died: vCPUs stopped, memory saved (QEMU in `postmigrate`).
    await withQmp(`${dir}/qmp.sock`, (qmp) => saveMemory(qmp, `${dir}/interrupted.snap`, 60_000));
    expect(await envdSilent(e)).toBe(true);
    const restarted = await newDriver(false);
    expect((await restarted.reconcile()).adopted.map((i) => i.instanceId)).toEqual([e.instanceId]);
    expect((await fetch(`${e.envdUrl}/health`, { signal: AbortSignal.timeout(10_000) })).ok).toBe(true);
    await driver.kill(e.instanceId);
  }, 60_000);

  it("a snapshot id nobody made: the create fails naming it, and leaves nothing behind", async () => {
    await expect(
      driver.create({ template, resources: template.recipe.defaults, snapshotId: "ms-unknown" }),
    ).rejects.toThrow("snapshot 'ms-unknown' does not exist on this node");
    expect(driver.list()).toEqual([]);
    expect(footprint()).toEqual(NOTHING);
  }, 60_000);
});
