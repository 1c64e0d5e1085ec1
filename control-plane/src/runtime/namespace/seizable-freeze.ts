import { readFile } from "node:fs/promises";
import type { SandboxCgroup } from "./cgroups.js";

/**
 * A frozen moment CRIU can dump. A shell starting a command vforks: the parent waits in the kernel until its child
 * has exec'd. When the freeze catches the child before its exec, the parent stays in that wait, and CRIU can seize
 * the child but never the parent (`Unseizable non-zombie N found, state D`): the dump times out, and every retry
 * finds the same frozen moment, so the sandbox could never be checkpointed (a loop starting `sleep` hit it in CI).
 * Such a moment is left again by thawing for a few milliseconds, which lets the child reach its exec.
 */
const ATTEMPTS = 100;

/**
 * How long the attempt-th thaw lasts: from ~2 ms, growing to ~40 ms (on a loaded machine a thawed child may not
 * run within 2 ms, and a loop of vforks caught 50 times in a row under a full test run), with jitter, so a loop's
 * period cannot lock onto the freezes. At most about 4 s of thaws in all (3 s on average).
 */
function thawMs(attempt: number): number {
  return Math.min(40, 2 * 1.08 ** attempt) * (0.5 + Math.random());
}

/** Where a task waiting for its vfork child sleeps (`wait_for_vfork_done`, inlined into `kernel_clone` here). */
function inVforkWait(wchan: string): boolean {
  return wchan === "kernel_clone" || wchan.includes("vfork");
}

/** The sandbox's processes that wait for a vfork child to exec (none once they are all past it). */
export async function vforkWaiters(cgroup: SandboxCgroup): Promise<number[]> {
  const waiting: number[] = [];
  for (const pid of await cgroup.pids()) {
    // A process that ended since the list was read has no wchan: it waits for nothing.
    const wchan = await readFile(`/proc/${pid}/wchan`, "utf8").catch(() => "");
    if (inVforkWait(wchan.trim())) waiting.push(pid);
  }
  return waiting;
}

/**
 * Freezes the sandbox (frozen already is fine) at a moment no process waits for a vfork child, thawing it for a few
 * milliseconds at a time until then. A paused sandbox runs those milliseconds too: the pause is a point in time to
 * its user, and the alternative is a sandbox that never leaves memory. Gives up after ATTEMPTS tries and leaves the
 * sandbox frozen; CRIU then fails with its own message and the dump is tried again later.
 */
export async function freezeSeizable(cgroup: SandboxCgroup): Promise<void> {
  await cgroup.freeze();
  for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
    // Two clean looks in a row: a single read of a task's wchan while the freeze settles was seen to miss a waiter
    // (a full test run's load on a PVM guest).
    if ((await vforkWaiters(cgroup)).length === 0 && (await vforkWaiters(cgroup)).length === 0) return;
    await cgroup.thaw();
    await new Promise((resolve) => setTimeout(resolve, thawMs(attempt)));
    await cgroup.freeze();
  }
}
