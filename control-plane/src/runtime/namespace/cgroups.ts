import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { mkdir, readdir, readFile, rmdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { SandboxResources } from "../driver.js";
import { exec } from "../exec.js";

/**
 * Cgroup limits for one sandbox, over cgroup v1 (this machine: one hierarchy per controller) or v2 (one
 * unified tree). The agent owns the cgroups; crun runs with `--cgroup-manager=disabled` and the sandbox
 * inherits its cgroups from the launcher, which joins them before exec'ing crun.
 */
export interface SandboxCgroup {
  /** `cgroup.procs` files a process writes its pid to, to join every controller. */
  readonly procsFiles: readonly string[];
  /**
   * The `cgroup.procs` of the sandbox's workload cgroup: a child with the sandbox's memory less envd's reserve
   * (workloadMemoryMB), which every process envd and the code gateway start joins. The sandbox gets it as a
   * descriptor opened on the host (instance-container.ts), never as a path.
   */
  readonly workloadProcsFile: string;
  /** The workload's OOM kill count (`oom_kill N`): v1 `memory.oom_control`, v2 `memory.events`. */
  readonly workloadOomControlFile: string;
  usage(): Promise<{
    memoryBytes: number;
    memoryLimitBytes: number;
    cpuUsec: number;
    pids: number;
    pidsLimit: number;
    /** Processes the kernel killed at the memory limit since the cgroup was made. */
    oomKills: number;
  }>;
  pids(): Promise<number[]>;
  /** Processes in the sandbox's cgroup but not in its workload (memory controller). */
  outsideWorkload(): Promise<number[]>;
  freeze(): Promise<void>;
  thaw(): Promise<void>;
  /** The directory CRIU's `--freeze-cgroup` takes (v1: the freezer hierarchy's; v2: the sandbox's). */
  readonly freezerDir: string;
  /**
   * SIGKILLs every process (frozen first, so nothing forks meanwhile) and waits until none is left; with
   * `wait: false` it returns once every process has the signal (none runs its code again), before they exit.
   */
  killAll(options?: { readonly wait?: boolean }): Promise<void>;
  /** Removes the cgroup directories; processes must be gone. Missing directories are fine. */
  remove(): Promise<void>;
  /** True when any of its directories exists. */
  exists(): boolean;
  /**
   * Ends the background class of a sandbox made `background` (CreateOptions): its normal CPU weight and its
   * `cpuCount` quota. Idempotent; for a sandbox made in the foreground it only writes what is there already.
   */
  foreground(cpuCount: number): Promise<void>;
}

export interface CreateOptions {
  /**
   * Start in the node's background CPU class: a warm pool's refill, whose start (crun, envd's Node.js start and
   * warm-up: about 250 ms of CPU) should leave the CPU to creates and commands that users wait for.
   */
  readonly background?: boolean;
}

/**
 * The background class, within the sandbox's own cpu cgroup (a sandbox's processes never move to another cpu
 * cgroup: they live in a cgroup namespace rooted there, and CRIU refuses a process outside its namespace's root):
 * the kernel's minimum weight against the node's other sandboxes, and at most half a CPU against the node's own
 * processes (a weight counts only among siblings).
 */
const BACKGROUND_SHARES = "2";
const BACKGROUND_QUOTA_US = 50_000;
const NORMAL_SHARES = "1024";
const CFS_PERIOD_US = 100_000;

/** A sandbox's CPU quota per period: its CPUs (at least 1 % of one). */
const cpuQuotaUs = (cpuCount: number) => Math.max(1000, Math.round(cpuCount * CFS_PERIOD_US));

export interface CgroupManager {
  readonly version: 1 | 2;
  prepare(): Promise<void>;
  open(name: string): SandboxCgroup;
  create(name: string, resources: SandboxResources, options?: CreateOptions): Promise<SandboxCgroup>;
  /** Names of the sandbox cgroups that exist under this agent's parent. */
  listNames(): Promise<string[]>;
}

const ROOT = "/sys/fs/cgroup";
/** The workload cgroup's name under a sandbox's. */
const WORKLOAD = "workload";

/**
 * The memory of a sandbox's workload cgroup: all of it but a reserve that only envd, tini and the code gateway can
 * use (an eighth, 32 to 128 MiB, at most half), so a memory bomb is killed inside the workload while envd still
 * answers. envd idles at about 40 MiB, the gateway at about 50.
 */
export function workloadMemoryMB(memoryMB: number): number {
  const reserve = Math.min(Math.floor(memoryMB / 2), Math.min(128, Math.max(32, Math.round(memoryMB / 8))));
  return memoryMB - reserve;
}

/** Where the node mounts the hierarchy that turns the kernel's `favordynmods` on (favorDynamicModifications). */
const DYNMODS_MOUNT = "/run/warren/cgroup-dynmods";

/**
 * Makes moving a process between cgroups cheap: on this machine each move (a write to `cgroup.procs`) waited for an
 * RCU grace period, 5–12 ms, and a sandbox's start makes several (the launcher joins five v1 controllers, envd moves
 * every command into the workload, a restore moves the user's processes back into it). With the kernel's
 * `favordynmods` (Linux ≥ 6.1) a move takes about 0.1 ms, for a slightly dearer fork and exit (a shared counter
 * instead of a per-CPU one). The setting is global but v1 cannot remount a hierarchy to change it, so the node
 * mounts a hierarchy of its own with no controller (like `name=systemd`), which turns it on for every hierarchy
 * while it is mounted. Returns why it could not (an older kernel), or undefined once it is on.
 */
export async function favorDynamicModifications(): Promise<string | undefined> {
  const mounts = await readFile("/proc/mounts", "utf8");
  if (/^\S+ \S+ cgroup2? \S*\bfavordynmods\b/m.test(mounts)) return undefined;
  await mkdir(DYNMODS_MOUNT, { recursive: true });
  try {
    await exec("mount", ["-t", "cgroup", "-o", "none,name=warren-dynmods,favordynmods", "cgroup", DYNMODS_MOUNT]);
    return undefined;
  } catch (error) {
    return (error as Error).message;
  }
}

export function detectCgroupManager(parent: string): CgroupManager {
  return existsSync(join(ROOT, "cgroup.controllers")) ? new CgroupV2(parent) : new CgroupV1(parent);
}

async function readNumber(path: string): Promise<number> {
  try {
    const text = (await readFile(path, "utf8")).trim();
    return text === "max" ? Number.MAX_SAFE_INTEGER : Number(text);
  } catch {
    return 0;
  }
}

async function readPids(file: string): Promise<number[]> {
  try {
    return (await readFile(file, "utf8")).split("\n").filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** readPids, synchronously: for the kills, which then wait on no other file work in libuv's pool. */
function readPidsNow(file: string): number[] {
  try {
    return readFileSync(file, "utf8").split("\n").filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/**
 * SIGKILLs the processes `procsFile` lists, again and again, until a read lists none it has not killed yet (a child
 * forked before its parent's kill shows up in the next read; a straggler is killed again while `waitEmpty` waits).
 * False when a fork loop outran it for `rounds` reads: then the freezer stops it.
 */
function killUntilNoneNew(procsFile: string, rounds = 20): boolean {
  const killed = new Set<number>();
  for (let round = 0; round < rounds; round++) {
    const fresh = readPidsNow(procsFile).filter((pid) => !killed.has(pid));
    if (fresh.length === 0) return true;
    killPids(fresh);
    for (const pid of fresh) killed.add(pid);
  }
  return false;
}

function killPids(pids: readonly number[]): void {
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}

/**
 * How long SIGKILLed processes get to exit. One blocked in uninterruptible disk I/O dies only when that I/O ends:
 * with another sandbox filling its disk on the same host disk, an idle pooled sandbox's processes took longer than
 * the ~4 s (2000 polls) this once allowed, and its removal gave up with its mounts still in place.
 */
const EXIT_AFTER_KILL_MS = 60_000;

async function waitEmpty(list: () => Promise<number[]>, retryKill: boolean): Promise<void> {
  const deadline = Date.now() + EXIT_AFTER_KILL_MS;
  for (let i = 0; ; i++) {
    const pids = await list();
    if (pids.length === 0) return;
    if (Date.now() > deadline) {
      throw new Error(`cgroup processes did not exit within ${EXIT_AFTER_KILL_MS / 1000} s of SIGKILL: ${pids}`);
    }
    if (retryKill && i % 50 === 49) killPids(pids);
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}

async function removeDir(path: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    try {
      await rmdir(path);
      return;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return;
      if (code !== "EBUSY") throw error;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
  throw new Error(`cgroup ${path} stayed busy`);
}

/** cgroup v1: memory, cpu, cpuacct, pids and freezer hierarchies, each with `<parent>/<name>`. */
class CgroupV1 implements CgroupManager {
  readonly version = 1 as const;
  private static readonly CONTROLLERS = ["memory", "cpu", "cpuacct", "pids", "freezer"] as const;

  constructor(private readonly parent: string) {}

  async prepare(): Promise<void> {
    for (const c of CgroupV1.CONTROLLERS) {
      if (!existsSync(join(ROOT, c))) throw new Error(`cgroup v1 controller '${c}' is not mounted at ${ROOT}/${c}`);
      await mkdir(join(ROOT, c, this.parent), { recursive: true });
    }
    // crun refuses "hybrid" hosts whose v2 tree still offers controllers (here: hugetlb, unused by anything).
    // Binding those controllers to v1 hierarchies makes the host plain v1, which crun accepts.
    const unified = join(ROOT, "unified", "cgroup.controllers");
    if (existsSync(unified)) {
      const offered = (await readFile(unified, "utf8")).trim().split(/\s+/).filter(Boolean);
      for (const controller of offered) {
        const target = join(ROOT, controller);
        await mkdir(target, { recursive: true });
        await exec("mount", ["-t", "cgroup", "-o", controller, "cgroup", target]);
      }
    }
  }

  open(name: string): SandboxCgroup {
    const dir = (c: string) => join(ROOT, c, this.parent, name);
    const dirs = CgroupV1.CONTROLLERS.map(dir);
    const freezerState = join(dir("freezer"), "freezer.state");
    // The freezer's files are read and written synchronously: the kernel answers in microseconds (a write starts
    // the freeze, it does not wait for it), while libuv's pool, busy with a refill's file work, made each of the
    // ~8 operations of a freeze and thaw wait ~0.5–1 ms (a kill's freeze + thaw took 5–8 ms, ~2 when synchronous;
    // a user's kill now skips the freeze: killAll).
    const reached = async (state: string, polls: number) => {
      for (let i = 0; i < polls; i++) {
        if (readFileSync(freezerState, "utf8").trim() === state) return true;
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
      return false;
    };
    const setFreezer = async (state: "FROZEN" | "THAWED") => {
      if (state === "THAWED") {
        writeFileSync(freezerState, state);
        if (await reached(state, 5000)) return;
        throw new Error("freezer did not reach THAWED");
      }
      // The v1 freezer can stay FREEZING when a task is being forked as the freeze begins (a sandbox that forks
      // in a loop hits it): thaw and freeze again, as runc does, for up to about 15 s.
      for (let attempt = 0; attempt < 150; attempt++) {
        writeFileSync(freezerState, "FROZEN");
        if (await reached("FROZEN", Math.min(20 + 5 * attempt, 100))) return;
        writeFileSync(freezerState, "THAWED");
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
      throw new Error("freezer did not reach FROZEN");
    };
    const pids = () => readPids(join(dir("pids"), "cgroup.procs"));
    // v1: only the memory hierarchy has the workload child (pids, cpu and the freezer stay flat).
    const workloadDir = join(dir("memory"), WORKLOAD);
    return {
      procsFiles: dirs.map((d) => join(d, "cgroup.procs")),
      workloadProcsFile: join(workloadDir, "cgroup.procs"),
      workloadOomControlFile: join(workloadDir, "memory.oom_control"),
      outsideWorkload: () => readPids(join(dir("memory"), "cgroup.procs")),
      exists: () => dirs.some((d) => existsSync(d)),
      pids,
      usage: async () => ({
        memoryBytes: await readNumber(join(dir("memory"), "memory.usage_in_bytes")),
        memoryLimitBytes: await readNumber(join(dir("memory"), "memory.limit_in_bytes")),
        cpuUsec: Math.round((await readNumber(join(dir("cpuacct"), "cpuacct.usage"))) / 1000),
        pids: await readNumber(join(dir("pids"), "pids.current")),
        pidsLimit: await readNumber(join(dir("pids"), "pids.max")),
        // v1 counts a kill only in the cgroup it happened in: the workload's kills are the sandbox's too.
        oomKills:
          oomKillCount(await readFile(join(dir("memory"), "memory.oom_control"), "utf8").catch(() => "")) +
          oomKillCount(await readFile(join(workloadDir, "memory.oom_control"), "utf8").catch(() => "")),
      }),
      freezerDir: dir("freezer"),
      freeze: () => setFreezer("FROZEN"),
      thaw: () => setFreezer("THAWED"),
      killAll: async ({ wait = true } = {}) => {
        if (!existsSync(dir("freezer"))) return;
        const procs = join(dir("freezer"), "cgroup.procs");
        // Every listed process SIGKILLed until a read lists none not yet killed, without freezing first: a killed
        // process cannot fork any more, and a child forked before its parent's kill is listed by the next read.
        // The freeze and thaw cost 4–6 ms of a 35 ms kill here, and as much again of the kernel's CPU at the
        // teardown that follows every kill (the freezer walking tasks that are already dying).
        if (killUntilNoneNew(procs)) {
          // A paused sandbox's processes were frozen: a SIGKILL takes them only once they are thawed.
          const state = (() => {
            try {
              return readFileSync(freezerState, "utf8").trim();
            } catch {
              return "THAWED"; // removed meanwhile: nothing left to thaw
            }
          })();
          if (state !== "THAWED") await setFreezer("THAWED").catch(() => undefined);
        } else {
          // A fork loop outran the kills. v1 has no cgroup.kill: freeze so no process forks between reading the
          // list and the kills.
          await setFreezer("FROZEN").catch(() => undefined);
          killPids(readPidsNow(procs));
          await setFreezer("THAWED").catch(() => undefined);
        }
        if (!wait) return;
        await waitEmpty(() => readPids(procs), true);
        await waitEmpty(pids, true);
      },
      remove: async () => {
        await removeDir(workloadDir);
        for (const d of dirs) await removeDir(d);
      },
      foreground: async (cpuCount) => {
        // On a create's path, while the refill it started fills libuv's thread pool with file work: a write of a
        // few bytes to a cgroup file takes microseconds in the kernel, but queued behind that work it took ~6 ms.
        writeFileSync(join(dir("cpu"), "cpu.shares"), NORMAL_SHARES);
        writeFileSync(join(dir("cpu"), "cpu.cfs_quota_us"), String(cpuQuotaUs(cpuCount)));
      },
    };
  }

  async create(name: string, resources: SandboxResources, options: CreateOptions = {}): Promise<SandboxCgroup> {
    const cgroup = this.open(name);
    const dir = (c: string) => join(ROOT, c, this.parent, name);
    for (const c of CgroupV1.CONTROLLERS) await mkdir(dir(c));
    const memory = String(resources.memoryMB * 1024 * 1024);
    await writeFile(join(dir("memory"), "memory.limit_in_bytes"), memory);
    // No swap escape hatch: memory+swap gets the same limit where the kernel accounts swap.
    const memsw = join(dir("memory"), "memory.memsw.limit_in_bytes");
    if (existsSync(memsw)) await writeFile(memsw, memory);
    await writeFile(join(dir("cpu"), "cpu.cfs_period_us"), String(CFS_PERIOD_US));
    const quota = cpuQuotaUs(resources.cpuCount);
    await writeFile(
      join(dir("cpu"), "cpu.cfs_quota_us"),
      String(options.background ? Math.min(quota, BACKGROUND_QUOTA_US) : quota),
    );
    if (options.background) await writeFile(join(dir("cpu"), "cpu.shares"), BACKGROUND_SHARES);
    await writeFile(join(dir("pids"), "pids.max"), String(resources.pidsMax));
    const workload = join(dir("memory"), WORKLOAD);
    await mkdir(workload);
    const workloadMemory = String(workloadMemoryMB(resources.memoryMB) * 1024 * 1024);
    await writeFile(join(workload, "memory.limit_in_bytes"), workloadMemory);
    if (existsSync(join(workload, "memory.memsw.limit_in_bytes"))) {
      await writeFile(join(workload, "memory.memsw.limit_in_bytes"), workloadMemory);
    }
    return cgroup;
  }

  async listNames(): Promise<string[]> {
    const names = new Set<string>();
    for (const c of CgroupV1.CONTROLLERS) {
      try {
        for (const entry of await readdir(join(ROOT, c, this.parent), { withFileTypes: true })) {
          if (entry.isDirectory()) names.add(entry.name);
        }
      } catch {
        // parent missing
      }
    }
    return [...names];
  }
}

/** cgroup v2: one directory per sandbox under `<parent>`, with memory, cpu and pids enabled on the parents. */
class CgroupV2 implements CgroupManager {
  readonly version = 2 as const;

  constructor(private readonly parent: string) {}

  async prepare(): Promise<void> {
    let path = ROOT;
    for (const part of this.parent.split("/").filter(Boolean)) {
      await writeFile(join(path, "cgroup.subtree_control"), "+memory +cpu +pids").catch(() => undefined);
      path = join(path, part);
      await mkdir(path, { recursive: true });
    }
    await writeFile(join(path, "cgroup.subtree_control"), "+memory +cpu +pids");
  }

  open(name: string): SandboxCgroup {
    const dir = join(ROOT, this.parent, name);
    // v2 has no processes in inner cgroups: envd and the gateway live in `system`, what they start in `workload`.
    const system = join(dir, "system");
    const workload = join(dir, WORKLOAD);
    const pids = async () => [
      ...(await readPids(join(dir, "cgroup.procs"))),
      ...(await readPids(join(system, "cgroup.procs"))),
      ...(await readPids(join(workload, "cgroup.procs"))),
    ];
    const setFrozen = async (frozen: boolean) => {
      await writeFile(join(dir, "cgroup.freeze"), frozen ? "1" : "0");
      for (let i = 0; i < 5000; i++) {
        const events = await readFile(join(dir, "cgroup.events"), "utf8");
        if (events.includes(`frozen ${frozen ? 1 : 0}`)) return;
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
      throw new Error("cgroup did not change its frozen state");
    };
    return {
      // A sandbox made before the split (adopted after an upgrade) has no `system` leaf.
      procsFiles: [join(existsSync(system) ? system : dir, "cgroup.procs")],
      workloadProcsFile: join(workload, "cgroup.procs"),
      workloadOomControlFile: join(workload, "memory.events"),
      outsideWorkload: async () => [
        ...(await readPids(join(dir, "cgroup.procs"))),
        ...(await readPids(join(system, "cgroup.procs"))),
      ],
      exists: () => existsSync(dir),
      pids,
      usage: async () => {
        const stat = await readFile(join(dir, "cpu.stat"), "utf8").catch(() => "");
        return {
          memoryBytes: await readNumber(join(dir, "memory.current")),
          memoryLimitBytes: await readNumber(join(dir, "memory.max")),
          cpuUsec: Number(/usage_usec (\d+)/.exec(stat)?.[1] ?? 0),
          pids: await readNumber(join(dir, "pids.current")),
          pidsLimit: await readNumber(join(dir, "pids.max")),
          oomKills: oomKillCount(await readFile(join(dir, "memory.events"), "utf8").catch(() => "")),
        };
      },
      freezerDir: dir,
      freeze: () => setFrozen(true),
      thaw: () => setFrozen(false),
      killAll: async ({ wait = true } = {}) => {
        if (!existsSync(dir)) return;
        writeFileSync(join(dir, "cgroup.kill"), "1");
        if (wait) await waitEmpty(pids, false);
      },
      remove: async () => {
        await removeDir(system);
        await removeDir(workload);
        await removeDir(dir);
      },
      // v2 has no background class yet (untested here: this host has no v2 controllers).
      foreground: async () => undefined,
    };
  }

  async create(name: string, resources: SandboxResources): Promise<SandboxCgroup> {
    const dir = join(ROOT, this.parent, name);
    await mkdir(dir);
    const memory = String(resources.memoryMB * 1024 * 1024);
    await writeFile(join(dir, "memory.max"), memory);
    if (existsSync(join(dir, "memory.swap.max"))) await writeFile(join(dir, "memory.swap.max"), "0");
    await writeFile(join(dir, "cpu.max"), `${cpuQuotaUs(resources.cpuCount)} ${CFS_PERIOD_US}`);
    await writeFile(join(dir, "pids.max"), String(resources.pidsMax));
    await mkdir(join(dir, "system"));
    await mkdir(join(dir, WORKLOAD));
    await writeFile(join(dir, "cgroup.subtree_control"), "+memory");
    await writeFile(join(dir, WORKLOAD, "memory.max"), String(workloadMemoryMB(resources.memoryMB) * 1024 * 1024));
    if (existsSync(join(dir, WORKLOAD, "memory.swap.max")))
      await writeFile(join(dir, WORKLOAD, "memory.swap.max"), "0");
    return this.open(name);
  }

  async listNames(): Promise<string[]> {
    try {
      return (await readdir(join(ROOT, this.parent), { withFileTypes: true }))
        .filter((entry) => entry.isDirectory())
        .map((entry) => entry.name);
    } catch {
      return [];
    }
  }
}

/** The `oom_kill` counter of v1's memory.oom_control or v2's memory.events (0 when the kernel has none). */
export function oomKillCount(text: string): number {
  return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
}
