import { Code } from "@connectrpc/connect";
import type { Spawner } from "@warren/platform/spawner";
import type { ProcessConfig } from "@warren/proto/process/process_pb";
import { EnvdError, failedPrecondition } from "../errors.js";
import type { Logger } from "../log.js";
import { type ChildEvents, type ChildHandle, spawnChild } from "./child.js";
import type { ProcessExit } from "./exit-status.js";
import { OutputBuffer, type OutputStream } from "./output-buffer.js";
import type { SecretMask } from "./secret-mask.js";
import type { PtySize, SpawnPlan } from "./spawn-plan.js";
import { RESUME_BELOW_BYTES, Subscription, type SubscriptionOwner } from "./subscription.js";

// E2B's chunk limits for data events.
const MAX_PIPE_CHUNK_BYTES = 32 * 1024;
const MAX_PTY_CHUNK_BYTES = 16 * 1024;
// A stream with more than this queued holds its process back until it falls below RESUME_BELOW_BYTES.
const PAUSE_ABOVE_BYTES = 4 * RESUME_BELOW_BYTES;

export interface ProcessOptions {
  /** The client's name for the process, unique among live processes. */
  readonly tag: string | undefined;
  readonly outputBufferBytes: number;
  readonly log: Logger;
  /** The values of the secrets this process was started with: masked as `***` in its output. */
  readonly mask?: SecretMask;
  /**
   * Called with the pid as soon as the process exists (it joins the workload cgroup), unless it joined by itself
   * before it exec'd (a child of a spawner given the workload: ChildHandle.inWorkload).
   */
  readonly onSpawn?: (pid: number) => void;
  /** The OOM kills in the sandbox's workload so far (WorkloadCgroup.oomKills); undefined when unknown. */
  readonly oomKills?: () => number | undefined;
  /** Forks pipe processes instead of envd (spawner.ts). */
  readonly spawner?: Spawner;
}

/**
 * One process envd started: its output (kept in a bounded buffer and fanned out to every
 * subscribed stream), its input, its signals and its exit. Streams come and go; the process
 * runs on regardless until it exits, is signalled, or its lifetime ends.
 */
export class ManagedProcess implements ChildEvents, SubscriptionOwner {
  readonly pid: number;
  readonly tag: string | undefined;
  readonly config: ProcessConfig;
  private readonly history: OutputBuffer;
  private readonly subscriptions = new Set<Subscription>();
  // Subscriptions whose backlog is why reading is paused.
  private readonly laggards = new Set<Subscription>();
  private readonly maxChunkBytes: number;
  private readonly exitPromise: Promise<ProcessExit>;
  private resolveExit!: (exit: ProcessExit) => void;
  private outcome: ProcessExit | undefined;
  private lifetimeTimer: NodeJS.Timeout | undefined;

  /** Set once envd signalled the process (a kill the client asked for is not the OOM killer's). */
  private signalled = false;

  private constructor(
    private readonly child: ChildHandle,
    private readonly plan: SpawnPlan,
    private readonly options: ProcessOptions,
    /** The workload's OOM kills when the process started (ProcessOptions.oomKills). */
    private readonly oomKillsBefore: number | undefined,
  ) {
    this.pid = child.pid;
    this.tag = options.tag;
    this.config = plan.config;
    this.history = new OutputBuffer(options.outputBufferBytes);
    this.maxChunkBytes = child.hasPty ? MAX_PTY_CHUNK_BYTES : MAX_PIPE_CHUNK_BYTES;
    this.exitPromise = new Promise((resolve) => {
      this.resolveExit = resolve;
    });
    child.attach(this);
  }

  static async start(plan: SpawnPlan, options: ProcessOptions): Promise<ManagedProcess> {
    const oomKillsBefore = options.oomKills?.();
    const child = await spawnChild(plan, options.log, options.spawner);
    if (!child.inWorkload) options.onSpawn?.(child.pid);
    return new ManagedProcess(child, plan, options, oomKillsBefore);
  }

  get running(): boolean {
    return this.outcome === undefined;
  }

  get hasPty(): boolean {
    return this.child.hasPty;
  }

  whenExited(): Promise<ProcessExit> {
    return this.exitPromise;
  }

  /**
   * A new stream's subscription. Without `replayFrom` it gets live output only; with it, first
   * the held output from that offset, then live output, with nothing lost or repeated between.
   * A finished process's subscription holds (the replay and) the end.
   */
  subscribe(replayFrom?: number): Subscription {
    const end = this.history.endOffset;
    if (replayFrom !== undefined && replayFrom > end) {
      throw new EnvdError(
        Code.OutOfRange,
        `replay offset ${replayFrom} is past the end of the output of pid ${this.pid} (${end} bytes so far)`,
      );
    }
    const first = replayFrom === undefined ? end : Math.max(replayFrom, this.history.startOffset);
    const subscription = new Subscription(first, this);
    if (replayFrom !== undefined) {
      for (const chunk of this.history.readFrom(replayFrom)) subscription.push({ kind: "data", chunk });
    }
    if (this.outcome) {
      subscription.push({ kind: "end", exit: this.outcome });
    } else {
      this.subscriptions.add(subscription);
      this.checkBacklog(subscription);
    }
    return subscription;
  }

  /** Kills the process group when `ms` have passed, unless the process has ended by then. */
  limitLifetime(ms: number): void {
    if (!this.running) return;
    clearTimeout(this.lifetimeTimer);
    this.lifetimeTimer = setTimeout(() => {
      this.options.log.info("process lifetime ended, killing it", { pid: this.pid, lifetimeMs: ms });
      this.signal("SIGKILL");
    }, ms);
  }

  signal(signal: NodeJS.Signals): void {
    if (!this.running) return;
    this.signalled = true;
    this.child.signalGroup(signal);
  }

  async writeStdin(data: Uint8Array): Promise<void> {
    if (!this.child.hasPty && !this.plan.stdin) {
      throw failedPrecondition(`stdin not enabled or closed for process with pid ${this.pid}`);
    }
    await this.child.writeStdin(data);
  }

  writePty(data: Uint8Array): void {
    this.child.writePty(data);
  }

  closeStdin(): void {
    if (!this.child.hasPty && !this.plan.stdin) {
      throw failedPrecondition(`stdin not enabled for process with pid ${this.pid}`);
    }
    this.child.closeStdin();
  }

  resize(size: PtySize): void {
    this.child.resize(size.cols, size.rows);
  }

  /** Lets go of the process as envd shuts down: no lifetime timer, and every open stream ends with `error`. */
  abandon(error: EnvdError): void {
    clearTimeout(this.lifetimeTimer);
    for (const subscription of this.subscriptions) subscription.push({ kind: "failed", error });
    this.subscriptions.clear();
    this.laggards.clear();
  }

  // ChildEvents

  output(stream: OutputStream, raw: Buffer): void {
    const data = this.options.mask?.active ? this.options.mask.apply(stream, raw) : raw;
    for (let start = 0; start < data.length; start += this.maxChunkBytes) {
      const chunk = this.history.append(stream, data.subarray(start, start + this.maxChunkBytes));
      for (const subscription of this.subscriptions) {
        subscription.push({ kind: "data", chunk });
        this.checkBacklog(subscription);
      }
    }
  }

  exit(exit: ProcessExit): void {
    const mask = this.options.mask;
    if (mask) {
      // The held-back tail of each stream could no longer become a secret: emit it before the end.
      for (const stream of mask.streams()) {
        const tail = mask.flush(stream);
        const chunk = tail.length > 0 ? this.history.append(stream, tail) : undefined;
        if (chunk) for (const subscription of this.subscriptions) subscription.push({ kind: "data", chunk });
      }
    }
    const ended = this.withOomCause(exit);
    this.outcome = ended;
    clearTimeout(this.lifetimeTimer);
    this.options.log.info("process ended", { pid: this.pid, status: ended.status });
    for (const subscription of this.subscriptions) subscription.push({ kind: "end", exit: ended });
    this.subscriptions.clear();
    this.laggards.clear();
    this.resolveExit(ended);
  }

  /**
   * A process envd did not signal that ended by SIGKILL (or its shell's 137) while the workload's OOM kills rose
   * was, as far as envd can tell, killed at the sandbox's memory limit: its error says so (E2B's SDK shows `error`
   * in CommandExitError); `status` stays Go's text, as E2B's envd sends it.
   */
  private withOomCause(exit: ProcessExit): ProcessExit {
    const killed = exit.status === "signal: killed" || exit.status === "exit status 137";
    if (!killed || this.signalled || this.oomKillsBefore === undefined) return exit;
    const after = this.options.oomKills?.();
    if (after === undefined || after <= this.oomKillsBefore) return exit;
    return { ...exit, error: `${exit.status} (out of memory: the sandbox's processes reached its memory limit)` };
  }

  // SubscriptionOwner

  drained(subscription: Subscription): void {
    if (this.laggards.delete(subscription) && this.laggards.size === 0) this.child.resume();
  }

  release(subscription: Subscription): void {
    this.subscriptions.delete(subscription);
    this.drained(subscription);
  }

  private checkBacklog(subscription: Subscription): void {
    if (subscription.backlogBytes <= PAUSE_ABOVE_BYTES || this.laggards.has(subscription)) return;
    this.laggards.add(subscription);
    if (this.laggards.size === 1) this.child.pause();
  }
}
