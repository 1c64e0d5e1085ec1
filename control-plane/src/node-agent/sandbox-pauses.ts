import { randomBytes } from "node:crypto";
import type { RuntimeDriver } from "../runtime/driver.js";
import { initEnvd } from "./envd-client.js";
import { AgentError } from "./errors.js";
import { type Logger, tenths } from "./log.js";
import type { RoutePublisher } from "./routes.js";
import {
  placementOf,
  type ResumeSandboxInput,
  type SandboxPlacement,
  type SandboxSummary,
  type sandboxRoute,
  summaryOf,
} from "./sandbox-model.js";
import type { SandboxQueue } from "./sandbox-queue.js";

/** A failed checkpoint is tried again this much later (at the earliest). */
const CHECKPOINT_RETRY_MS = 5_000;

/** What pausing and resuming work on: the agent's sandboxes, its driver, routes and per-sandbox queue. */
export interface SandboxPausesDeps {
  readonly driver: RuntimeDriver;
  readonly queue: SandboxQueue;
  readonly routes: RoutePublisher;
  /** The agent's sandboxes by id (updated here as they pause and resume). */
  readonly sandboxes: Map<string, SandboxSummary>;
  readonly requireSandbox: (sandboxId: string) => SandboxSummary;
  readonly routeOf: (summary: SandboxSummary) => ReturnType<typeof sandboxRoute>;
  readonly nextGeneration: () => number;
  /** How long a sandbox stays in the freezer before its checkpoint to disk (< 0: never). */
  readonly checkpointAfterMs: number;
  readonly isDraining: () => boolean;
  readonly log: Logger;
}

/**
 * The pause tiers of this node's sandboxes: the freezer first, a checkpoint on disk after `checkpointAfterMs`
 * (where the driver can checkpoint), or filesystem only; and resume from any of them as a new incarnation.
 */
export class SandboxPauses {
  private readonly timers = new Map<string, NodeJS.Timeout>();

  constructor(private readonly deps: SandboxPausesDeps) {}

  /** A killed sandbox's pending checkpoint is dropped. */
  forget(sandboxId: string): void {
    clearTimeout(this.timers.get(sandboxId));
    this.timers.delete(sandboxId);
  }

  /** Drops every pending checkpoint (the agent is stopping; a restarted agent schedules them again). */
  close(): void {
    for (const timer of this.timers.values()) clearTimeout(timer);
    this.timers.clear();
  }

  /**
   * Pauses a sandbox in two tiers. First the cgroup freezer (instant; memory stays resident): the route turns
   * `paused` before the freeze, same exec and generation, so proxies drop the sandbox's open streams and stop
   * sending traffic; a failed freeze puts the route back. Then, when the driver can checkpoint (CRIU) and the
   * sandbox is still paused `checkpointAfterMs` later, it is converted to a checkpoint on disk and its memory is
   * released. `memory: false` (filesystem only) ends every process right after the freeze; resume reboots.
   */
  async pause(sandboxId: string, memory: boolean): Promise<void> {
    await this.deps.queue.run(sandboxId, async () => {
      const sandbox = this.deps.requireSandbox(sandboxId);
      if (sandbox.paused) throw new AgentError("failed_precondition", `sandbox '${sandboxId}' is already paused`);
      const startedAt = performance.now();
      const paused: SandboxSummary = { ...sandbox, paused: true };
      await this.deps.routes.write(this.deps.routeOf(paused));
      try {
        await this.deps.driver.pause(sandbox.instanceId);
      } catch (error) {
        await this.deps.routes.write(this.deps.routeOf(sandbox)).catch(() => undefined);
        throw new AgentError("internal", `pausing sandbox '${sandboxId}' failed: ${(error as Error).message}`);
      }
      await this.deps.driver.label(sandbox.instanceId, { pausedMemory: memory ? "1" : "0" });
      this.deps.sandboxes.set(sandboxId, paused);
      if (memory) this.scheduleCheckpoint(sandboxId);
      else {
        // Filesystem only: the processes end now (memory released); resume reboots over the kept disk.
        await this.deps.driver.stop(sandbox.instanceId).catch((error) =>
          this.deps.log.warn("stopping a filesystem-only paused sandbox failed; it stays frozen", {
            sandboxId,
            error: (error as Error).message,
          }),
        );
      }
      this.deps.log.info("sandbox paused", {
        sandboxId,
        exec: sandbox.exec,
        tier: memory ? "freezer" : "filesystem",
        memory,
        ms: tenths(performance.now() - startedAt),
      });
    });
  }

  /** After `checkpointAfterMs` paused, the sandbox goes from the freezer to a checkpoint on disk. */
  scheduleCheckpoint(sandboxId: string, delay = this.deps.checkpointAfterMs): void {
    if (!this.deps.driver.canCheckpoint || this.deps.checkpointAfterMs < 0 || this.deps.isDraining()) return;
    clearTimeout(this.timers.get(sandboxId));
    const timer = setTimeout(() => {
      this.timers.delete(sandboxId);
      void this.checkpoint(sandboxId);
    }, delay);
    timer.unref();
    this.timers.set(sandboxId, timer);
  }

  /** Converts a frozen sandbox to a checkpoint; a failure leaves it frozen (still resumable) and is logged. */
  private async checkpoint(sandboxId: string): Promise<void> {
    await this.deps.queue
      .run(sandboxId, async () => {
        const sandbox = this.deps.sandboxes.get(sandboxId);
        if (!sandbox?.paused || this.deps.isDraining()) return;
        const instance = this.deps.driver.list().find((i) => i.instanceId === sandbox.instanceId);
        if (!instance || instance.checkpointed || instance.stopped) return;
        const startedAt = performance.now();
        try {
          const result = await this.deps.driver.checkpoint(sandbox.instanceId);
          this.deps.log.info("paused sandbox checkpointed to disk", {
            sandboxId,
            ms: tenths(performance.now() - startedAt),
            imageMiB: tenths(result.imageBytes / 2 ** 20),
            memoryBeforeMiB: tenths(result.memoryBeforeBytes / 2 ** 20),
            memoryAfterMiB: tenths(result.memoryAfterBytes / 2 ** 20),
          });
        } catch (error) {
          this.deps.log.warn("checkpoint failed; the sandbox stays frozen in memory and is tried again later", {
            sandboxId,
            error: (error as Error).message,
          });
          this.scheduleCheckpoint(sandboxId, Math.max(this.deps.checkpointAfterMs, CHECKPOINT_RETRY_MS));
        }
      })
      .catch((error) => this.deps.log.warn("checkpoint skipped", { sandboxId, error: (error as Error).message }));
  }

  /**
   * Resumes a paused sandbox as a new incarnation: thaws it (freezer tier) or restores its checkpoint, gives it
   * a new exec id and a larger generation (recorded with the instance, so a restarted agent knows it), and writes
   * the route `running`; the route event tells every proxy to drop what it cached for the old incarnation.
   * Tokens are unchanged (envd keeps its /init). A failed resume leaves the sandbox paused, its checkpoint
   * intact. A sandbox already running answers with its current placement (a retried resume).
   */
  async resume(input: ResumeSandboxInput): Promise<SandboxPlacement> {
    return this.deps.queue.run(input.sandboxId, async () => {
      const sandbox = this.deps.requireSandbox(input.sandboxId);
      if (!sandbox.paused) return placementOf(sandbox);
      clearTimeout(this.timers.get(input.sandboxId));
      this.timers.delete(input.sandboxId);
      const startedAt = performance.now();
      const current = this.deps.driver.list().find((i) => i.instanceId === sandbox.instanceId);
      const reboot = !input.memory || current?.stopped === true;
      let tier: string;
      let envdVersion = "";
      try {
        if (reboot) {
          // A cold start over the kept disk (filesystem-only pause, or `memory: false` asked at resume).
          const instance = await this.deps.driver.reboot(sandbox.instanceId);
          envdVersion = await initEnvd(
            instance.envdUrl,
            {
              envVars: input.envVars ?? {},
              accessToken: input.envdAccessToken ?? "",
              defaultUser: "user",
              defaultWorkdir: "/home/user",
            },
            this.deps.driver.envdInitTimeoutMs,
          );
          tier = "reboot";
        } else {
          tier = (await this.deps.driver.resume(sandbox.instanceId)).tier;
        }
      } catch (error) {
        throw new AgentError("internal", `resuming sandbox '${input.sandboxId}' failed: ${(error as Error).message}`);
      }
      const exec = randomBytes(8).toString("hex");
      const generation = Math.max(this.deps.nextGeneration(), sandbox.generation + 1);
      const instance = await this.deps.driver.label(sandbox.instanceId, {
        exec,
        generation: String(generation),
        pausedMemory: "",
      });
      const summary = summaryOf(instance);
      if (!summary) throw new AgentError("internal", "instance lost its labels");
      this.deps.sandboxes.set(input.sandboxId, summary);
      if (!(await this.deps.routes.write(this.deps.routeOf(summary)))) {
        this.deps.log.warn("Redis holds a newer route than the resumed sandbox", { sandboxId: input.sandboxId, exec });
      }
      this.deps.log.info("sandbox resumed", {
        sandboxId: input.sandboxId,
        exec,
        previousExec: sandbox.exec,
        tier,
        ms: tenths(performance.now() - startedAt),
      });
      return { ...placementOf(summary), envdVersion };
    });
  }
}
