import { readdirSync, readFileSync, readSync, writeSync } from "node:fs";
import type { Logger } from "./log.js";

/** The descriptors of a sandbox's workload cgroup its node handed to PID 1 (each undefined: not given). */
export interface WorkloadDescriptors {
  /** Its `cgroup.procs`, open for writing: a pid written there joins the workload. */
  readonly procsFd: number | undefined;
  /** Its `memory.oom_control`, open for reading: `oom_kill N` counts the OOM kills inside it. */
  readonly oomControlFd: number | undefined;
}

/**
 * The sandbox's workload cgroup: every process envd (or the code gateway: its kernels) starts is moved into it right
 * after it starts — unless it joined by itself before it exec'd, as the children of envd's spawner do
 * (`warren-exec --serve-beside --workload-fd`, SpawnedProcess.inWorkload) — so their memory is held to the
 * sandbox's limit less a reserve that only envd, tini and the code gateway can use, and a memory bomb is killed
 * inside it while envd keeps answering.
 *
 * envd cannot see the node's cgroups: the node's launcher opened the workload's files as host root and handed the
 * open files to the sandbox (crun --preserve-fds). A cgroup v1 write is allowed by the credentials the file was
 * opened with (Linux ≥ 5.16), so envd can move a process even after it has dropped to `user`. Node gives these
 * descriptors to none of its children, so no command can use them. Moving only adds limits: at worst (a process
 * forked and orphaned before its parent was moved) the sandbox's own limits still hold, and the user's processes are
 * still the OOM killer's first pick.
 */
export class WorkloadCgroup {
  private warned = false;

  constructor(
    private readonly fds: WorkloadDescriptors,
    private readonly log: Logger,
  ) {}

  /**
   * Moves `pid`, what it forked before it was moved, and what it forks from now on into the workload cgroup; a
   * process already gone is fine. The process runs from the moment it was spawned, so a busy envd moves it only after
   * its shell may have forked (a login shell's profile does): each process is moved first and its children read
   * after, so a child forked before its parent moved is found and moved, and one forked after is born inside.
   */
  join(pid: number): void {
    if (this.fds.procsFd === undefined) return;
    const pending = [pid];
    for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
      if (this.move(next)) pending.push(...childrenOf(next));
    }
  }

  /** Whether `pid` is in the workload now (false: it is gone, or could not be moved). */
  private move(pid: number): boolean {
    if (this.fds.procsFd === undefined) return false;
    try {
      writeSync(this.fds.procsFd, `${pid}\n`);
      return true;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ESRCH") return false;
      if (!this.warned) {
        this.warned = true;
        this.log.warn("could not move a process into the workload cgroup; it runs in the sandbox's own", {
          pid,
          code,
          error: (error as Error).message,
        });
      }
      return false;
    }
  }

  /** How many processes the kernel has killed at the workload's memory limit; undefined when unknown. */
  oomKills(): number | undefined {
    if (this.fds.oomControlFd === undefined) return undefined;
    try {
      const buffer = Buffer.alloc(256);
      const length = readSync(this.fds.oomControlFd, buffer, 0, buffer.length, 0);
      const match = /^oom_kill (\d+)$/m.exec(buffer.subarray(0, length).toString("latin1"));
      return match ? Number(match[1]) : undefined;
    } catch {
      return undefined;
    }
  }
}

/** The pids `pid`'s threads have forked and not yet lost (none when it is gone or /proc cannot tell). */
function childrenOf(pid: number): number[] {
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  const children: number[] = [];
  for (const task of tasks) {
    try {
      for (const child of readFileSync(`/proc/${pid}/task/${task}/children`, "latin1").split(" ")) {
        if (child) children.push(Number(child));
      }
    } catch {
      // The thread ended meanwhile.
    }
  }
  return children;
}
