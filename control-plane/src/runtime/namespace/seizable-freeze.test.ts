import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exec } from "../exec.js";
import { type CgroupManager, detectCgroupManager, type SandboxCgroup } from "./cgroups.js";
import { CRIU_ENV } from "./criu.js";
import { probeCriu } from "./criu-probe.js";
import { freezeSeizable, vforkWaiters } from "./seizable-freeze.js";

// Real cgroups on this host (the tests run as root) and real shells: dash vforks to start each external command, so
// two loops starting /bin/true spend much of their time with a parent waiting for its child's exec.
const PARENT = "warren/test-seizable-freeze";
const NAME = "ivfork";
const LOOP = "while :; do /bin/true; done";
const CRIU = "/var/lib/warren/criu/criu";

describe("freezing a sandbox for a CRIU dump", () => {
  let cgroups: CgroupManager;
  let cgroup: SandboxCgroup;
  const loops: ChildProcess[] = [];

  beforeAll(async () => {
    cgroups = detectCgroupManager(PARENT);
    await cgroups.prepare();
    await cgroups.open(NAME).remove();
    cgroup = await cgroups.create(NAME, { cpuCount: 1, memoryMB: 256, diskSizeMB: 64, pidsMax: 64 });
    const join = cgroup.procsFiles.map((f) => `echo $$ > ${f}`).join("; ");
    for (let i = 0; i < 2; i++) {
      // Session leaders of their own without a terminal: trees CRIU dumps as they are.
      const loop = spawn("/bin/dash", ["-c", `${join}; exec /bin/dash -c "$0"`, LOOP], {
        detached: true,
        stdio: "ignore",
      });
      loops.push(loop);
    }
    for (let i = 0; i < 100 && (await cgroup.pids()).length < 2; i++) await new Promise((r) => setTimeout(r, 10));
  });

  afterAll(async () => {
    for (const loop of loops) loop.kill("SIGKILL");
    await cgroup.killAll();
    await cgroup.remove();
  });

  it("a plain freeze can catch a shell waiting for its vfork child, which is what CRIU cannot seize", async () => {
    let caught = 0;
    for (let round = 0; round < 500 && caught === 0; round++) {
      await cgroup.freeze();
      caught += (await vforkWaiters(cgroup)).length;
      await cgroup.thaw();
    }
    expect(caught).toBeGreaterThan(0);
  });

  it("a seizable freeze never leaves one", async () => {
    for (let round = 0; round < 200; round++) {
      await freezeSeizable(cgroup);
      expect(await vforkWaiters(cgroup)).toEqual([]);
      await cgroup.thaw();
    }
  });

  it("freezes a sandbox that is frozen already, and it stays frozen", async () => {
    await cgroup.freeze();
    await freezeSeizable(cgroup);
    expect(await vforkWaiters(cgroup)).toEqual([]);
    const before = (await cgroup.usage()).cpuUsec;
    await new Promise((r) => setTimeout(r, 200));
    expect((await cgroup.usage()).cpuUsec).toBe(before);
    await cgroup.thaw();
  });

  it("CRIU cannot dump a tree frozen in a vfork wait, and dumps it from a seizable freeze (where CRIU works here)", async () => {
    const usable = existsSync(CRIU) && (await probeCriu(CRIU)).usable;
    if (!usable) {
      // The host has no working CRIU: sandboxes stay frozen in memory, nothing here is dumped.
      expect(existsSync(CRIU) ? (await probeCriu(CRIU)).reason : "absent").not.toBe("");
      return;
    }
    const dir = await mkdtemp(join(tmpdir(), "warren-seizable-"));
    const dump = async (images: string) => {
      await mkdir(images);
      return exec(
        CRIU,
        [
          "dump",
          "-t",
          String(loops[0]?.pid),
          "-D",
          images,
          "-o",
          "dump.log",
          "--leave-running",
          "--timeout",
          "3",
        ].concat(["--freeze-cgroup", cgroup.freezerDir]),
        { allowFailure: true, timeoutMs: 30_000, env: CRIU_ENV },
      );
    };
    try {
      // Frozen moments with a shell of the dumped tree waiting for its vfork child. Not every one stops CRIU: a
      // child frozen inside its execve finishes it once CRIU thaws the tree to seize it, which frees the parent;
      // one frozen before its exec does not, and the dump fails. A few tries find one (each failure costs
      // CRIU's 3 s timeout).
      const stuckLogs: string[] = [];
      for (let attempt = 0; attempt < 8 && stuckLogs.length === 0; attempt++) {
        let caught = false;
        for (let round = 0; round < 1000 && !caught; round++) {
          await cgroup.freeze();
          caught = (await vforkWaiters(cgroup)).some((pid) => descendsFrom(pid, loops[0]?.pid ?? 0));
          if (!caught) await cgroup.thaw();
        }
        expect(caught).toBe(true);
        const images = join(dir, `stuck-${attempt}`);
        const result = await dump(images);
        if (result.code !== 0) stuckLogs.push(await readFile(join(images, "dump.log"), "utf8"));
        await cgroup.thaw();
      }
      expect(stuckLogs.length).toBe(1);
      // CRIU names the shell stuck in its vfork wait, or (a child caught mid-exec, then stopped by CRIU's seize)
      // times out on a process of the cgroup it could not take into the tree: either way, no dump.
      expect(stuckLogs[0]).toMatch(
        /Unseizable non-zombie \d+ found, state D|Unexpected process \d+ in the freezer cgroup[\s\S]*Dumping FAILED/,
      );

      await freezeSeizable(cgroup);
      const dumped = await dump(join(dir, "seizable"));
      expect(dumped.code, await readFile(join(dir, "seizable", "dump.log"), "utf8").catch(() => "")).toBe(0);
    } finally {
      await cgroup.thaw().catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});

/** True when `pid` is `ancestor` or one of its descendants (its parent chain in /proc). */
function descendsFrom(pid: number, ancestor: number): boolean {
  for (let current = pid; current > 1; ) {
    if (current === ancestor) return true;
    try {
      const stat = readFileSync(`/proc/${current}/stat`, "utf8");
      current = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    } catch {
      return false;
    }
  }
  return false;
}
