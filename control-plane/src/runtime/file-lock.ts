import { spawn } from "node:child_process";
import { mkdir } from "node:fs/promises";
import { dirname } from "node:path";

/**
 * Runs `job` while holding an exclusive flock(2) on `path`, across processes (concurrent test files, two agents).
 * The lock is held by a `flock` child whose stdin is our pipe: if this process dies, the pipe closes, the child
 * exits and the kernel drops the lock, so a crash never leaves a stale lock behind.
 */
export async function withFileLock<T>(path: string, job: () => Promise<T>): Promise<T> {
  await mkdir(dirname(path), { recursive: true });
  const holder = spawn("flock", ["-x", path, "-c", "echo locked; exec cat >/dev/null"], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    holder.stdout.setEncoding("utf8").once("data", () => resolve());
    holder.once("error", reject);
    holder.once("exit", (code) => reject(new Error(`flock ${path} exited with ${code}`)));
  });
  try {
    return await job();
  } finally {
    const exited = new Promise((resolve) => holder.once("exit", resolve));
    holder.stdin.end();
    await exited;
  }
}
