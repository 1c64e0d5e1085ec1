import { appendFile, readFile } from "node:fs/promises";
import type { Logger } from "@warren/platform/log";
import type { SandboxCgroup } from "./cgroups.js";

/**
 * The sandbox's own processes: PID 1 (tini), envd, and the code gateway with its restart loop. They stay outside
 * the workload cgroup; everything else a sandbox runs was started by them and belongs in it.
 */
function isSandboxSystemProcess(cmdline: string): boolean {
  const argv = cmdline.split("\0");
  return (
    argv[0] === "/usr/bin/tini" ||
    argv.some((arg) => arg.includes("/opt/warren/envd/") || arg.includes("/opt/warren/code-gateway/"))
  );
}

/**
 * After a CRIU restore every process is in the sandbox's cgroup (`--manage-cgroups=ignore`: the restore joins the
 * launcher's). The user's go back into the workload cgroup, so the memory reserve holds again for what a restored
 * sandbox already ran, not only for commands started after. A process that claims to be envd stays where it is:
 * the sandbox's own limits still hold for it. Returns how many moved.
 */
export async function moveRestoredIntoWorkload(cgroup: SandboxCgroup, log: Logger): Promise<number> {
  let moved = 0;
  for (const pid of await cgroup.outsideWorkload()) {
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => undefined);
    if (cmdline === undefined || isSandboxSystemProcess(cmdline)) continue;
    try {
      await appendFile(cgroup.workloadProcsFile, `${pid}\n`);
      moved += 1;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== "ESRCH") log.warn("a restored process could not join the workload cgroup", { pid, code });
    }
  }
  return moved;
}
