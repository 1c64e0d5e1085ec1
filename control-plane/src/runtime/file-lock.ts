import { spawn } from "node:child_process";
import { mkdir } from "node:fs/promises";
import { dirname } from "node:path";

/**
 * Runs `job` while holding an exclusive flock(2) on `path`, across processes (concurrent test files, two agents).
 * The lock is held by a `flock` child whose stdin is our pipe: if this process dies, the pipe closes, the child
 * exits and the kernel drops the lock, so a crash never leaves a stale lock behind.
 */
export async function withFileLock<T>(path: string, job: () => Promise<T>): Promise<T> {
  const held = await lock(path, true);
  if (!held) throw new Error(`flock ${path} gave up waiting`);
  try {
    return await job();
  } finally {
    await held.release();
  }
}

/** A lock held until `release` (or until this process dies). */
export interface HeldFileLock {
  release(): Promise<void>;
}

/** Takes the exclusive flock on `path` if no one holds it; undefined when someone does. Same crash safety. */
export function tryFileLock(path: string): Promise<HeldFileLock | undefined> {
  return lock(path, false);
}

// flock(1) exits 1 when -n finds the lock held.
const FLOCK_BUSY = 1;

async function lock(path: string, wait: boolean): Promise<HeldFileLock | undefined> {
  await mkdir(dirname(path), { recursive: true });
  const holder = spawn("flock", [wait ? "-x" : "-xn", path, "-c", "echo locked; exec cat >/dev/null"], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const taken = await new Promise<boolean>((resolve, reject) => {
    holder.stdout.setEncoding("utf8").once("data", () => resolve(true));
    holder.once("error", reject);
    holder.once("exit", (code) =>
      !wait && code === FLOCK_BUSY ? resolve(false) : reject(new Error(`flock ${path} exited with ${code}`)),
    );
  });
  if (!taken) return undefined;
  let released: Promise<void> | undefined;
  return {
    release() {
      released ??= new Promise<void>((resolve) => {
        holder.once("exit", () => resolve());
        holder.stdin.end();
      });
      return released;
    },
  };
}
