import type { Db } from "../store/db.js";
import { MasterError } from "./errors.js";
import type { SandboxLifecycle } from "./lifecycle.js";
import type { Logger } from "./log.js";

/**
 * Ends sandboxes whose endAt has passed: kill, or pause when the sandbox asked for autoPause. Timers live in
 * PostgreSQL (end_at), not in memory, so a standby that becomes leader finds every one of them.
 */
export async function evictExpired(
  db: Db,
  lifecycle: SandboxLifecycle,
  log: Logger,
  batch = 100,
  concurrency = 8,
): Promise<number> {
  const due = await db.query<{ id: string; auto_pause: boolean; auto_pause_memory: boolean }>(
    `SELECT id, auto_pause, auto_pause_memory FROM sandboxes
     WHERE state = 'running' AND end_at <= now() ORDER BY end_at LIMIT $1`,
    [batch],
  );
  let ended = 0;
  // The timeout must hold: a sandbox whose node cannot pause it is killed rather than retried every pass.
  const pauseOrKill = async (id: string, memory: boolean) => {
    try {
      await lifecycle.pause(id, undefined, memory);
    } catch (error) {
      if (!(error instanceof MasterError && (error.kind === "unimplemented" || error.kind === "unavailable"))) {
        throw error;
      }
      log.warn("auto-pause failed; killing the expired sandbox", { sandboxId: id, error });
      await lifecycle.kill(id, undefined, "timeout_pause_failed");
    }
  };
  const evict = async (sandbox: { id: string; auto_pause: boolean; auto_pause_memory: boolean }) => {
    try {
      if (sandbox.auto_pause) await pauseOrKill(sandbox.id, sandbox.auto_pause_memory);
      else await lifecycle.kill(sandbox.id, undefined, "timeout");
      ended++;
      log.info("sandbox timed out", { sandboxId: sandbox.id, action: sandbox.auto_pause ? "pause" : "kill" });
    } catch (error) {
      // Another transition got there first (kill, pause): nothing to do now; a later pass retries otherwise.
      if (!(error instanceof MasterError && (error.kind === "not_found" || error.kind === "conflict"))) {
        log.warn("evicting sandbox failed", { sandboxId: sandbox.id, error });
      }
    }
  };
  // A few at a time: node calls dominate, and one slow node must not hold up every other expiry.
  const queue = [...due.rows];
  await Promise.all(
    Array.from({ length: Math.min(concurrency, queue.length) }, async () => {
      for (let next = queue.shift(); next; next = queue.shift()) await evict(next);
    }),
  );
  return ended;
}
