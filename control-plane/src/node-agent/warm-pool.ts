import type { Instance } from "../runtime/driver.js";
import type { Logger } from "./log.js";
import { DemandRate, type PoolSizing, poolTarget } from "./pool-sizing.js";
import { BackgroundTicket } from "./start-gate.js";

export interface WarmPoolOptions {
  /** Floor, ceiling and demand window of the pool's size (pool-sizing.ts). */
  readonly sizing: PoolSizing;
  /** Refill starts this pool runs at once. */
  readonly refillConcurrency: number;
  /**
   * How long a claim's refill waits for the claims to pause while the pool holds more than a quarter of its
   * target (0: at once). A sandbox start is ~300 ms of CPU; started at the claim, it competes with the claimed
   * sandbox's /init and the user's first calls.
   */
  readonly refillDelayMs?: number;
  /**
   * Runs one refill start: the node's start gate as a background start, so refills yield to creates; `ticket` is
   * promoted when a create comes to wait for this refill.
   */
  readonly schedule?: <T>(start: () => Promise<T>, ticket: BackgroundTicket) => Promise<T>;
  /**
   * Runs a start begun for a create that waits (`next`): the node's start gate as a create's start (arrival order,
   * StartQueueFull past its queue).
   */
  readonly scheduleForCreate?: <T>(start: () => Promise<T>) => Promise<T>;
  /** Gives a background start its normal CPU class once a create waits for it (the driver's `foreground`). */
  readonly promote?: (instanceId: string) => Promise<void>;
  /** Clock, ms (tests). */
  readonly now?: () => number;
  /** Holds the refills of every pool that shares it (RefillHold). */
  readonly hold?: RefillHold;
}

/**
 * Holds the refills of the pools that share it while a create takes the room idle pooled sandboxes gave back
 * (sandbox-creation.ts): a refill begun meanwhile would take that room first. Refills resume when the last hold ends.
 */
export class RefillHold {
  private holds = 0;
  private readonly resumes = new Set<() => void>();

  get held(): boolean {
    return this.holds > 0;
  }

  async during<T>(run: () => Promise<T>): Promise<T> {
    this.holds++;
    try {
      return await run();
    } finally {
      this.holds--;
      if (this.holds === 0) for (const resume of [...this.resumes]) resume();
    }
  }

  /** `resume` runs when the holds end; the returned function stops that. */
  onResume(resume: () => void): () => void {
    this.resumes.add(resume);
    return () => this.resumes.delete(resume);
  }
}

/** How the pool runs one start: its CPU class, and where the driver tells the new instance's id. */
export interface PoolStart {
  /** Start in the node's background CPU class: nobody waits for it (yet). */
  readonly background: boolean;
  /** The driver's `InstanceSpec.promoted`: a create came to wait for this background start. */
  readonly promoted: () => boolean;
  /** The driver's `InstanceSpec.onInstance`: the id, once it exists, lets a create that comes to wait promote it. */
  readonly onInstance: (instanceId: string) => void;
}

/** A pool with ready sandboxes, and the disk each of them holds a promise of (MiB). */
export interface IdlePool {
  readonly pool: WarmPool;
  readonly diskSizeMB: number;
}

/** The pool was closed (the node agent is stopping) while a create waited for one of its starts. */
export class WarmPoolClosed extends Error {
  constructor(templateId: string) {
    super(`the warm pool of '${templateId}' closed while a create waited for it`);
    this.name = "WarmPoolClosed";
  }
}

/** A start begun for a create found, once its slot came, that no create waits for it and the pool is full. */
class StartNotNeeded extends Error {
  constructor() {
    super("no create waits for this start any more");
    this.name = "StartNotNeeded";
  }
}

/** A start under way: promoted once a create waits for it (its id may come later than the promotion). */
interface Starting {
  instanceId: string | undefined;
  readonly background: boolean;
  promoted: boolean;
  readonly ticket: BackgroundTicket;
}

interface Waiter {
  readonly resolve: (instance: Instance) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * Ready-to-claim sandboxes of one template: started, envd answering, not yet initialised (no token, no env, no
 * route). A claim takes one in O(1) and counts towards the template's demand; the pool's size follows that
 * demand between a floor and a ceiling (pool-sizing.ts). Refills start as soon as the pool is below its target,
 * `refillConcurrency` at a time, through `schedule` (the node's start gate), which runs them only on start slots
 * no create waits for: a burst's creates go first, refills fill the gaps. A pool above its target (demand
 * faded) gives the extra sandboxes back at `trim()`.
 *
 * A create that finds the pool empty waits (`next`) for the first of the pool's starts to finish instead of
 * starting one of its own: a refill under way is most of the way there (it is made foreground for it), and the
 * pool keeps at least one start under way per waiting create, begun on a create's start slot. Waiting creates are
 * served in arrival order; one that gives up leaves its start to the pool.
 */
export class WarmPool {
  private readonly ready: Instance[] = [];
  private readonly demand: DemandRate;
  private readonly now: () => number;
  private readonly starting = new Set<Starting>();
  private readonly waiters: Waiter[] = [];
  private closed = false;
  private failures = 0;
  private readonly running = new Set<Promise<void>>();
  private delayedRefill: NodeJS.Timeout | undefined;
  private backoff: NodeJS.Timeout | undefined;
  private readonly stopResuming: (() => void) | undefined;

  constructor(
    readonly templateId: string,
    private readonly options: WarmPoolOptions,
    private readonly start: (start: PoolStart) => Promise<Instance>,
    private readonly discard: (instance: Instance) => Promise<void>,
    private readonly log: Logger,
  ) {
    this.demand = new DemandRate(options.sizing.windowMs);
    this.now = options.now ?? Date.now;
    this.stopResuming = options.hold?.onResume(() => this.refill());
  }

  get readyCount(): number {
    return this.ready.length;
  }

  /** Creates waiting for one of the pool's starts (tests, metrics). */
  get waitingCount(): number {
    return this.waiters.length;
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
   * After a `take()` that found nothing: the first of the pool's starts to finish, in arrival order among the
   * creates that wait. A refill under way is made foreground; with more creates waiting than starts under way, a
   * start is begun for this one on a create's start slot (`scheduleForCreate`), whose error (StartQueueFull, a
   * failed start) it gets. `signal`: the caller gave up; it leaves the queue and its start goes to the pool.
   */
  next(signal?: AbortSignal): Promise<Instance> {
    if (this.closed) return Promise.reject(new WarmPoolClosed(this.templateId));
    signal?.throwIfAborted();
    return new Promise<Instance>((resolve, reject) => {
      const abandon = () => {
        const index = this.waiters.indexOf(waiter);
        if (index < 0) return;
        this.waiters.splice(index, 1);
        reject(signal?.reason);
      };
      const waiter: Waiter = {
        resolve: (instance) => {
          signal?.removeEventListener("abort", abandon);
          resolve(instance);
        },
        reject: (error) => {
          signal?.removeEventListener("abort", abandon);
          reject(error);
        },
      };
      signal?.addEventListener("abort", abandon, { once: true });
      this.waiters.push(waiter);
      this.serveWaiters();
    });
  }

  /**
   * Keeps one start under way per waiting create: promotes background ones (oldest first), begins the rest on
   * creates' start slots. A ready sandbox (one that finished between a take and its next) serves at once.
   */
  private serveWaiters(): void {
    while (this.waiters.length > 0 && this.ready.length > 0) this.deliver(this.ready.shift() as Instance);
    let promoted = [...this.starting].filter((s) => !s.background || s.promoted).length;
    for (const start of this.starting) {
      if (promoted >= this.waiters.length) break;
      if (start.background && !start.promoted) {
        start.promoted = true;
        promoted++;
        start.ticket.promote();
        if (start.instanceId) this.promote(start.instanceId);
      }
    }
    while (!this.closed && this.starting.size < this.waiters.length) {
      const start = this.startForCreate().finally(() => this.running.delete(start));
      this.running.add(start);
    }
    // The refills it promoted no longer count as the pool's own: the pool refills beside them.
    this.refill();
  }

  private promote(instanceId: string): void {
    this.options
      .promote?.(instanceId)
      .catch((error) =>
        this.log.warn("making a pool start foreground failed", { templateId: this.templateId, instanceId, error }),
      );
  }

  /** Hands a finished start to the longest-waiting create, else to the ready list (or away, once closed). */
  private deliver(instance: Instance): void {
    const waiter = this.waiters.shift();
    if (waiter) {
      waiter.resolve(instance);
      return;
    }
    if (this.closed) {
      // Tracked with the starts: close() resolves only once it is gone too.
      const removal = this.discard(instance)
        .catch((error) => this.log.warn("removing a pooled sandbox failed", { templateId: this.templateId, error }))
        .finally(() => this.running.delete(removal));
      this.running.add(removal);
      return;
    }
    this.ready.push(instance);
  }

  /** Runs one of the pool's starts, `background` or for a waiting create; resolves with it, or rejects. */
  private async runStart(starting: Starting): Promise<Instance> {
    const { background } = starting;
    const schedule: <T>(start: () => Promise<T>, ticket: BackgroundTicket) => Promise<T> = background
      ? (this.options.schedule ?? ((start) => start()))
      : (this.options.scheduleForCreate ?? ((start) => start()));
    try {
      return await schedule(() => {
        // Closed while it waited for a slot: a stopping agent starts nothing it would have to remove.
        if (this.closed) throw new WarmPoolClosed(this.templateId);
        // Begun for a create that has since given up or been served: with no create left for it and the pool at
        // its target, it starts nothing (as a create that gives up while it waits for a slot starts nothing).
        if (!background && this.starting.size > this.waiters.length && this.coming > this.target) {
          throw new StartNotNeeded();
        }
        return this.start({
          background,
          promoted: () => starting.promoted,
          onInstance: (instanceId) => {
            starting.instanceId = instanceId;
            if (starting.promoted) this.promote(instanceId);
          },
        });
      }, starting.ticket);
    } finally {
      this.starting.delete(starting);
    }
  }

  /** Registers a start under way (before it is scheduled, so the counts see it at once). */
  private begin(background: boolean): Starting {
    const starting: Starting = { instanceId: undefined, background, promoted: false, ticket: new BackgroundTicket() };
    this.starting.add(starting);
    return starting;
  }

  /**
   * A start a create waited for failed: the longest-waiting create gets its error, as a create whose own start
   * fails does. One failure fails one create, never a retry: on a node out of room (its disk budget, say) each
   * retry would fail too, and the master places a refused create elsewhere.
   */
  private failWaiter(error: unknown): void {
    this.waiters.shift()?.reject(error);
  }

  /** A start begun because a create waits with none under way for it; its failure goes to the oldest waiter. */
  private async startForCreate(): Promise<void> {
    try {
      this.deliver(await this.runStart(this.begin(false)));
    } catch (error) {
      if (error instanceof StartNotNeeded) return;
      this.log.warn("a pool start for a waiting create failed", { templateId: this.templateId, error });
      this.failWaiter(error);
    }
    this.refill();
  }

  /**
   * A claim's refill: at once when the pool is down to its low-water mark (a quarter of its target), else once
   * `refillDelayMs` pass without another claim — each claim pushes it back — so a run of claims, and the claimed
   * sandboxes' first moments, have the CPU while the pool still holds enough for them.
   */
  private refillSoon(): void {
    const delay = this.options.refillDelayMs ?? 0;
    clearTimeout(this.delayedRefill);
    this.delayedRefill = undefined;
    if (delay <= 0 || this.ready.length <= Math.floor(this.target / 4)) {
      this.refill();
      return;
    }
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

  /** Sandboxes the pool will hold once its starts end: ready ones, and starts no waiting create will take. */
  private get coming(): number {
    return this.ready.length + Math.max(0, this.starting.size - this.waiters.length);
  }

  /**
   * Begins refill starts while the pool (ready, and starts no create waits for) is below its target, at most
   * `refillConcurrency` background starts at once: a refill a create came to wait for no longer counts, so
   * waiting creates do not hold the pool's own refills back. After a failure, none until the back-off ends; none
   * while a RefillHold is held.
   */
  refill(): void {
    if (this.closed || this.backoff || this.options.hold?.held) return;
    const concurrency = Math.max(1, this.options.refillConcurrency);
    while (this.refilling < concurrency && this.coming < this.target) {
      const run = this.refillOnce().finally(() => this.running.delete(run));
      this.running.add(run);
    }
  }

  /** Background starts under way that no create waits for. */
  private get refilling(): number {
    let count = 0;
    for (const start of this.starting) if (start.background && !start.promoted) count++;
    return count;
  }

  private async refillOnce(): Promise<void> {
    const starting = this.begin(true);
    try {
      const instance = await this.runStart(starting);
      this.failures = 0;
      this.deliver(instance);
    } catch (error) {
      if (this.closed) return;
      if (starting.promoted) this.failWaiter(error);
      this.failures++;
      this.log.error("warm pool refill failed", { templateId: this.templateId, error, failures: this.failures });
      // Back off so a broken template does not spin the node.
      this.backoff = setTimeout(
        () => {
          this.backoff = undefined;
          this.refill();
        },
        Math.min(30_000, 500 * 2 ** this.failures),
      );
      this.backoff.unref();
      return;
    }
    this.refill();
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

  /**
   * Gives back up to `count` ready sandboxes (oldest first), whatever the demand: a create the node had no room for
   * needs the room they hold (sandbox-creation.ts). Resolves with how many went once they are removed.
   */
  async release(count: number): Promise<number> {
    const given = this.ready.splice(0, Math.max(0, count));
    for (const instance of given) {
      await this.discard(instance).catch((error) =>
        this.log.warn("removing a pooled sandbox failed", { templateId: this.templateId, error }),
      );
    }
    return given.length;
  }

  /** Resolves once the pool holds its target (tests and benchmarks wait for it). */
  async filled(): Promise<void> {
    while (!this.closed && this.ready.length < this.target) {
      this.refill();
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  /** Stops refilling, fails the creates that wait, and removes every pooled sandbox (starts under way too). */
  async close(): Promise<void> {
    this.closed = true;
    this.stopResuming?.();
    clearTimeout(this.delayedRefill);
    clearTimeout(this.backoff);
    for (const waiter of this.waiters.splice(0)) waiter.reject(new WarmPoolClosed(this.templateId));
    // Starts that end meanwhile hand their sandbox to a removal tracked here too.
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
    for (const instance of this.ready.splice(0)) await this.discard(instance);
  }
}
