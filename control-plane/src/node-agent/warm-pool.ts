import type { Instance } from "../runtime/driver.js";
import type { Logger } from "./log.js";
import { DemandRate, type PoolSizing, poolTarget } from "./pool-sizing.js";

export interface WarmPoolOptions {
  /** Floor, ceiling and demand window of the pool's size (pool-sizing.ts). */
  readonly sizing: PoolSizing;
  /** Refill starts this pool runs at once. */
  readonly refillConcurrency: number;
  /**
   * How long a claim's refill waits while the pool still holds a ready sandbox (0: at once). A sandbox start is
   * ~300 ms of CPU; started at the claim, it competes with the claimed sandbox's /init and the user's first calls.
   */
  readonly refillDelayMs?: number;
  /** Runs one refill start: the node's start gate as a background start, so refills yield to creates. */
  readonly schedule?: <T>(start: () => Promise<T>) => Promise<T>;
  /** Clock, ms (tests). */
  readonly now?: () => number;
}

/**
 * Ready-to-claim sandboxes of one template: started, envd answering, not yet initialised (no token, no env, no
 * route). A claim takes one in O(1) and counts towards the template's demand; the pool's size follows that
 * demand between a floor and a ceiling (pool-sizing.ts). Refills start as soon as the pool is below its target,
 * `refillConcurrency` at a time, through `schedule` (the node's start gate), which runs them only on start slots
 * no create waits for: a burst's creates go first, refills fill the gaps. A pool above its target (demand
 * faded) gives the extra sandboxes back at `trim()`.
 */
export class WarmPool {
  private readonly ready: Instance[] = [];
  private readonly demand: DemandRate;
  private readonly now: () => number;
  private inFlight = 0;
  private workers = 0;
  private closed = false;
  private failures = 0;
  private readonly running = new Set<Promise<void>>();
  private delayedRefill: NodeJS.Timeout | undefined;

  constructor(
    readonly templateId: string,
    private readonly options: WarmPoolOptions,
    private readonly start: () => Promise<Instance>,
    private readonly discard: (instance: Instance) => Promise<void>,
    private readonly log: Logger,
  ) {
    this.demand = new DemandRate(options.sizing.windowMs);
    this.now = options.now ?? Date.now;
  }

  get readyCount(): number {
    return this.ready.length;
  }

  /** The size the pool refills to now (the demand of the last window, between floor and ceiling). */
  get target(): number {
    return poolTarget(this.demand.perSecond(this.now()), this.options.sizing);
  }

  /** A create's claim: counts as demand, returns a ready sandbox if there is one, and refills. */
  take(): Instance | undefined {
    this.demand.record(this.now());
    const instance = this.ready.shift();
    this.refillSoon();
    return instance;
  }

  /**
   * A claim's refill: at once when the pool is empty, else after `refillDelayMs` (one timer for a burst of
   * claims), so the claimed sandbox's first moments have the CPU.
   */
  private refillSoon(): void {
    const delay = this.options.refillDelayMs ?? 0;
    if (this.ready.length === 0 || delay <= 0) {
      this.refill();
      return;
    }
    if (this.delayedRefill) return;
    this.delayedRefill = setTimeout(() => {
      this.delayedRefill = undefined;
      this.refill();
    }, delay);
    this.delayedRefill.unref();
  }

  /** A create that started cold before this pool existed: it counts as demand too. */
  recordClaim(): void {
    this.demand.record(this.now());
    this.refill();
  }

  /** A ready sandbox without counting demand (a create that already claimed, rechecking once its turn came). */
  takeReady(): Instance | undefined {
    const instance = this.ready.shift();
    if (instance) this.refill();
    return instance;
  }

  /** Starts refill workers while the pool (ready and starting) is below its target. */
  refill(): void {
    const concurrency = Math.max(1, this.options.refillConcurrency);
    while (!this.closed && this.workers < concurrency && this.ready.length + this.inFlight < this.target) {
      this.workers++;
      const worker = this.refillWorker().finally(() => {
        this.workers--;
        this.running.delete(worker);
      });
      this.running.add(worker);
    }
  }

  private async refillWorker(): Promise<void> {
    while (!this.closed && this.ready.length + this.inFlight < this.target) {
      this.inFlight++;
      let instance: Instance;
      try {
        instance = await (this.options.schedule ?? ((start) => start()))(this.start);
      } catch (error) {
        this.failures++;
        this.log.error("warm pool refill failed", { templateId: this.templateId, error, failures: this.failures });
        // Back off so a broken template does not spin the node.
        await new Promise((resolve) => setTimeout(resolve, Math.min(30_000, 500 * 2 ** this.failures)));
        continue;
      } finally {
        this.inFlight--;
      }
      this.failures = 0;
      if (this.closed) {
        await this.discard(instance);
        return;
      }
      this.ready.push(instance);
    }
  }

  /** Gives back ready sandboxes above the target (demand faded), oldest first; refills if below it. */
  async trim(): Promise<void> {
    const excess = this.ready.length - this.target;
    if (excess <= 0) {
      this.refill();
      return;
    }
    const extra = this.ready.splice(0, excess);
    this.log.info("warm pool shrinks with demand", {
      templateId: this.templateId,
      removed: extra.length,
      ready: this.ready.length,
    });
    for (const instance of extra) {
      await this.discard(instance).catch((error) =>
        this.log.warn("removing a pooled sandbox failed", { templateId: this.templateId, error }),
      );
    }
  }

  /** Resolves once the pool holds its target (tests and benchmarks wait for it). */
  async filled(): Promise<void> {
    while (!this.closed && this.ready.length < this.target) {
      this.refill();
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  /** Stops refilling and removes every pooled sandbox. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.delayedRefill);
    await Promise.allSettled([...this.running]);
    for (const instance of this.ready.splice(0)) await this.discard(instance);
  }
}
