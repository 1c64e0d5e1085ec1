import { spawn } from "node:child_process";
import { mkdir } from "node:fs/promises";
import { dirname } from "node:path";

/**
 * Runs `job` while holding an exclusive flock(2) on `path`, across processes (concurrent test files, two agents).
 * The lock is held by a `flock` child whose stdin is our pipe: if this process dies, the pipe closes, the child
 * exits and the kernel drops the lock, so a crash never leaves a stale lock behind.
 */
export async function withFileLock<T>(path: string, job: () => Promise<T>): Promise<T> {
  const held = await lock(path, undefined);
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

/**
 * Takes the exclusive flock on `path` if it is free within `waitMs` (0: free now); undefined when someone holds it
 * still. Same crash safety.
 */
export function tryFileLock(path: string, waitMs = 0): Promise<HeldFileLock | undefined> {
  return lock(path, waitMs);
}

// flock(1) exits 1 when -n finds the lock held, or -w waited in vain.
const FLOCK_BUSY = 1;

/** `waitMs` undefined: wait as long as it takes. */
async function lock(path: string, waitMs: number | undefined): Promise<HeldFileLock | undefined> {
  await mkdir(dirname(path), { recursive: true });
  const wait = waitMs === undefined ? [] : waitMs > 0 ? ["-w", String(waitMs / 1000)] : ["-n"];
  const holder = spawn("flock", ["-x", ...wait, path, "-c", "echo locked; exec cat >/dev/null"], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const taken = await new Promise<boolean>((resolve, reject) => {
    holder.stdout.setEncoding("utf8").once("data", () => resolve(true));
    holder.once("error", reject);
    holder.once("exit", (code) =>
      waitMs !== undefined && code === FLOCK_BUSY
        ? resolve(false)
        : reject(new Error(`flock ${path} exited with ${code}`)),
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
