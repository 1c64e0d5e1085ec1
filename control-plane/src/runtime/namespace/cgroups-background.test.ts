import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CgroupManager, detectCgroupManager, favorDynamicModifications } from "./cgroups.js";

// Real cgroup v1 hierarchies (this host; the tests run as root), as the namespace driver makes them.
const PARENT = "warren/test-background";
const RESOURCES = { cpuCount: 1, memoryMB: 128, diskSizeMB: 64, pidsMax: 16 };

/** The cpu hierarchy's cgroup of `pid`, from /proc. */
function cpuCgroupOf(pid: number): string {
  const line = readFileSync(`/proc/${pid}/cgroup`, "utf8")
    .split("\n")
    .find((l) => l.split(":")[1]?.split(",").includes("cpu"));
  return line?.split(":")[2] ?? "";
}

describe("the background CPU class (cgroup v1)", () => {
  let cgroups: CgroupManager;
  const children: ChildProcess[] = [];

  beforeAll(async () => {
    cgroups = detectCgroupManager(PARENT);
    await cgroups.prepare();
    for (const name of ["bgone", "fgone"]) {
      await cgroups.open(name).killAll();
      await cgroups.open(name).remove();
    }
  });

  afterAll(async () => {
    for (const child of children) child.kill("SIGKILL");
    for (const name of ["bgone", "fgone"]) {
      await cgroups.open(name).killAll();
      await cgroups.open(name).remove();
    }
  });

  /** A shell that joins the cgroup's files as the launcher does, then forks a sleep. */
  function launchIn(procsFiles: readonly string[]): ChildProcess {
    const join = procsFiles.map((f) => `echo $$ > ${f}`).join("; ");
    const child = spawn("sh", ["-c", `${join}; sleep 60 & wait`], { stdio: "ignore" });
    children.push(child);
    return child;
  }

  async function until<T>(read: () => T | undefined, timeoutMs = 5000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const value = read();
      if (value !== undefined) return value;
      if (Date.now() > deadline) throw new Error("condition not met in time");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  it("a background sandbox takes its CPU in a top-level group of the minimum weight until foreground() moves every process back", async () => {
    expect(readFileSync("/sys/fs/cgroup/cpu/warren-background/cpu.shares", "utf8").trim()).toBe("2");
    const cgroup = await cgroups.create("bgone", RESOURCES, { background: true });
    const background = "/warren-background/test-background/bgone";
    expect(readFileSync(`/sys/fs/cgroup/cpu${background}/cpu.cfs_quota_us`, "utf8").trim()).toBe("100000");
    const shell = launchIn(cgroup.procsFiles);
    const pids = await until(() => {
      const listed = readFileSync(`/sys/fs/cgroup/cpu${background}/cgroup.procs`, "utf8").split("\n").filter(Boolean);
      return listed.length === 2 ? listed.map(Number) : undefined;
    });
    expect(pids).toContain(shell.pid);
    // The other controllers are the sandbox's own as always.
    const memory = readFileSync("/sys/fs/cgroup/memory/warren/test-background/bgone/cgroup.procs", "utf8");
    expect(memory.split("\n").filter(Boolean).map(Number).sort()).toEqual([...pids].sort());

    await cgroups.open("bgone").foreground();
    for (const pid of pids) expect(cpuCgroupOf(pid)).toBe("/warren/test-background/bgone");
    expect(existsSync(`/sys/fs/cgroup/cpu${background}`)).toBe(false);
    expect(cgroups.open("bgone").procsFiles).toContain("/sys/fs/cgroup/cpu/warren/test-background/bgone/cgroup.procs");
    await cgroups.open("bgone").foreground();

    await cgroup.killAll();
    await cgroup.remove();
    expect(cgroup.exists()).toBe(false);
  });

  it("a sandbox made in the foreground has no background group; remove() also takes a background one left behind", async () => {
    const cgroup = await cgroups.create("fgone", RESOURCES);
    expect(existsSync("/sys/fs/cgroup/cpu/warren-background/test-background/fgone")).toBe(false);
    expect(cgroup.procsFiles).toContain("/sys/fs/cgroup/cpu/warren/test-background/fgone/cgroup.procs");
    await cgroup.foreground();
    await cgroup.remove();

    await cgroups.create("bgone", RESOURCES, { background: true });
    expect(await cgroups.listNames()).toContain("bgone");
    await cgroups.open("bgone").remove();
    expect(existsSync("/sys/fs/cgroup/cpu/warren-background/test-background/bgone")).toBe(false);
    expect(await cgroups.listNames()).not.toContain("bgone");
  });
});

describe("favorDynamicModifications", () => {
  it("leaves a cgroup hierarchy with the kernel's favordynmods mounted, once", async () => {
    const favoring = async () =>
      (await readFile("/proc/mounts", "utf8"))
        .split("\n")
        .filter((line) => /\bcgroup2? \S*\bfavordynmods\b/.test(line));
    expect(await favorDynamicModifications()).toBeUndefined();
    const mounted = await favoring();
    expect(mounted.length).toBeGreaterThan(0);
    expect(await favorDynamicModifications()).toBeUndefined();
    expect(await favoring()).toEqual(mounted);
  });
});
