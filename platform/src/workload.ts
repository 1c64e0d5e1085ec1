import { writeSync } from "node:fs";
import type { Logger } from "./log.js";

/**
 * The sandbox's workload cgroup: every process envd (or the code gateway: its kernels) starts is moved into it right after it starts, so their memory
 * is held to the sandbox's limit less a reserve that only envd, tini and the code gateway can use, and a memory bomb
 * is killed inside it while envd keeps answering.
 *
 * envd cannot see the node's cgroups: the node's launcher opened the workload's `cgroup.procs` as host root and
 * handed the open file to the sandbox (crun --preserve-fds). A cgroup v1 write is allowed by the credentials the
 * file was opened with (Linux ≥ 5.16), so envd can move a process even after it has dropped to `user`. Node gives
 * the descriptor to none of its children, so no command can use it. Moving only adds limits: at worst (a process
 * that forks before it is moved) the sandbox's own limits still hold, and the user's processes are still the OOM
 * killer's first pick.
 */
export class WorkloadCgroup {
  private warned = false;

  constructor(
    /** The inherited descriptor (`--workload-fd`); undefined: no workload cgroup (outside a sandbox). */
    private readonly fd: number | undefined,
    private readonly log: Logger,
  ) {}

  /** Moves `pid` (and what it forks from now on) into the workload cgroup; a process already gone is fine. */
  join(pid: number): void {
    if (this.fd === undefined) return;
    try {
      writeSync(this.fd, `${pid}\n`);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ESRCH") return;
      if (!this.warned) {
        this.warned = true;
        this.log.warn("could not move a process into the workload cgroup; it runs in the sandbox's own", {
          pid,
          code,
          error: (error as Error).message,
        });
      }
    }
  }
}
