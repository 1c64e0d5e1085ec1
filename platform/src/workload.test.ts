import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, rmdirSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { createLogger } from "./log.js";
import { WorkloadCgroup } from "./workload.js";

// A real cgroup v1 memory hierarchy, as a sandbox's node makes it (the tests run as root).
const MEMORY = "/sys/fs/cgroup/memory";

describe("WorkloadCgroup (a real cgroup v1)", () => {
  const dir = `${MEMORY}/warren-workload-test-${process.pid}`;
  let child: ChildProcess | undefined;

  afterEach(async () => {
    if (child?.pid !== undefined) {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    if (existsSync(dir)) rmdirSync(dir);
  });

  it("moves a process together with the children it forked before it was moved, and what it forks after", async () => {
    mkdirSync(dir);
    const procsFd = openSync(`${dir}/cgroup.procs`, "w");
    try {
      // A shell that has already forked (a subshell that forked in turn) by the time it is moved.
      child = spawn("sh", ["-c", "(sleep 30 & wait) & sleep 30 & read line; sleep 30 & wait"], {
        detached: true,
        stdio: ["pipe", "ignore", "ignore"],
      });
      const pid = child.pid as number;
      const before = await descendantsOnceSettled(pid, 3);
      const workload = new WorkloadCgroup({ procsFd, oomControlFd: undefined }, createLogger("test"));
      workload.join(pid);
      const inside = (): number[] =>
        readFileSync(`${dir}/cgroup.procs`, "utf8").split("\n").filter(Boolean).map(Number);
      expect(inside().sort()).toEqual([pid, ...before].sort());
      // Forked after the move: born inside.
      child.stdin?.write("go\n");
      await until(() => inside().length === before.length + 2);
      expect(inside()).toContain(pid);
    } finally {
      closeSync(procsFd);
    }
  });

  it("a pid that is gone is no error", () => {
    mkdirSync(dir);
    const procsFd = openSync(`${dir}/cgroup.procs`, "w");
    try {
      new WorkloadCgroup({ procsFd, oomControlFd: undefined }, createLogger("test")).join(2 ** 22 - 1);
      expect(readFileSync(`${dir}/cgroup.procs`, "utf8")).toBe("");
    } finally {
      closeSync(procsFd);
    }
  });
});

/** Every descendant of `pid`, once there are `count` of them. */
async function descendantsOnceSettled(pid: number, count: number): Promise<number[]> {
  let found: number[] = [];
  await until(() => {
    found = descendants(pid);
    return found.length === count;
  });
  return found;
}

function descendants(pid: number): number[] {
  const children = readFileSync(`/proc/${pid}/task/${pid}/children`, "latin1").split(" ").filter(Boolean).map(Number);
  return children.flatMap((child) => [child, ...descendants(child)]);
}

async function until(condition: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
