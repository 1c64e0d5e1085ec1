import type { RuntimeDriver } from "../runtime/driver.js";
import type { Logger } from "./log.js";
import type { RoutePublisher } from "./routes.js";
import type { SandboxSummary } from "./sandbox-model.js";
import type { SandboxQueue } from "./sandbox-queue.js";

/** How often running sandboxes are checked for a dead PID 1. */
const WATCH_MS = 2_000;

export interface SandboxWatchdogDeps {
  readonly driver: RuntimeDriver;
  readonly queue: SandboxQueue;
  readonly routes: RoutePublisher;
  /** The agent's sandboxes by id (a dead one is removed here). */
  readonly sandboxes: Map<string, SandboxSummary>;
  readonly isDraining: () => boolean;
  readonly log: Logger;
}

/**
 * The watchdog: a running sandbox whose PID 1 exited (envd died with it: killed, or out of memory) is removed at
 * once — route first, then everything it held — and why is left in Redis for the master, which records the
 * sandbox lost with that reason. Nothing stays behind saying `running`.
 */
export class SandboxWatchdog {
  private timer: NodeJS.Timeout | undefined;
  private watching = false;

  constructor(private readonly deps: SandboxWatchdogDeps) {}

  start(): void {
    this.timer = setInterval(() => void this.watch(), WATCH_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  private async watch(): Promise<void> {
    const deathOf = this.deps.driver.deathOf?.bind(this.deps.driver);
    if (!deathOf || this.deps.isDraining() || this.watching) return;
    this.watching = true;
    try {
      for (const sandbox of [...this.deps.sandboxes.values()]) {
        if (sandbox.paused || !(await deathOf(sandbox.instanceId).catch(() => undefined))) continue;
        await this.deps.queue
          .run(sandbox.sandboxId, async () => {
            const current = this.deps.sandboxes.get(sandbox.sandboxId);
            if (!current || current.exec !== sandbox.exec || current.paused) return;
            const reason = await deathOf(current.instanceId);
            if (!reason) return;
            this.deps.sandboxes.delete(current.sandboxId);
            await this.deps.routes.recordCrash(current.sandboxId, reason).catch(() => undefined);
            await this.deps.routes.delete(current.sandboxId, current.exec, current.generation).catch(() => undefined);
            await this.deps.driver
              .kill(current.instanceId)
              .catch((error) =>
                this.deps.log.error("removing a dead sandbox failed", { sandboxId: current.sandboxId, error }),
              );
            this.deps.log.warn("sandbox died; removed", { sandboxId: current.sandboxId, exec: current.exec, reason });
          })
          .catch(() => undefined);
      }
    } finally {
      this.watching = false;
    }
  }
}
