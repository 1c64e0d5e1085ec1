/**
 * A counting gate for sandbox starts. Starting a sandbox is CPU-bound (crun, mounts, envd's own start); a burst
 * of a hundred creates on a small node started all at once makes every one of them slow, past the ready
 * deadline, instead of most of them fast. Creates beyond the limit wait in arrival order for a free slot.
 *
 * Warm-pool refills are background starts: at most `backgroundLimit` of them run at once, and one begins only
 * while no create waits, so refills use the cores creates leave idle and never delay a create by more than the
 * refills already running. The create queue is bounded: past `maxQueued` waiting creates the node refuses
 * (StartQueueFull) instead of queueing work it could not start before its caller gives up; a create whose
 * caller gave up while it waited (its signal aborted) leaves the queue and starts nothing.
 */
export class StartQueueFull extends Error {
  constructor(readonly queued: number) {
    super(`node is busy: ${queued} creates already wait for a start slot`);
    this.name = "StartQueueFull";
  }
}

interface Waiter {
  readonly resolve: () => void;
  /** Changes once, to false, when a create comes to wait for this refill (BackgroundTicket.promote). */
  background: boolean;
}

/**
 * A refill's hold on the gate, which a create that comes to wait for that refill promotes (WarmPool.next): from
 * then on it is a create's start — it stops counting against the refills' limit (another refill may begin), and
 * if it still waits for a slot it takes its turn among the creates.
 */
export class BackgroundTicket {
  private promoted = false;
  private onPromote: (() => void) | undefined;

  get isPromoted(): boolean {
    return this.promoted;
  }

  promote(): void {
    if (this.promoted) return;
    this.promoted = true;
    this.onPromote?.();
  }

  /** The gate's hook (one at a time: set while the start waits or runs, cleared when it ends). */
  bind(onPromote: (() => void) | undefined): void {
    this.onPromote = onPromote;
  }
}

export class StartGate {
  private running = 0;
  private backgroundRunning = 0;
  private readonly waiting: Waiter[] = [];

  constructor(
    private readonly limit: number,
    private readonly backgroundLimit = limit,
    private readonly maxQueued = Number.POSITIVE_INFINITY,
  ) {
    if (!Number.isInteger(limit) || limit < 1)
      throw new Error(`start gate limit must be a positive integer, got ${limit}`);
    if (!Number.isInteger(backgroundLimit) || backgroundLimit < 0)
      throw new Error(`start gate background limit must be a non-negative integer, got ${backgroundLimit}`);
  }

  /** Creates waiting for a slot now (metrics, tests). */
  get queued(): number {
    return this.waiting.filter((w) => !w.background).length;
  }

  /** A create's start: waits its turn in arrival order (StartQueueFull past `maxQueued` waiting). */
  run<T>(start: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    return this.runAs(false, start, signal);
  }

  /**
   * A refill's start: waits until a slot is free, fewer than `backgroundLimit` refills run, and no create waits.
   * `ticket`: promoted (a create waits for this refill), it becomes a create's start.
   */
  runBackground<T>(start: () => Promise<T>, ticket?: BackgroundTicket): Promise<T> {
    if (ticket?.isPromoted) return this.runAs(false, start);
    return this.runAs(true, start, undefined, ticket);
  }

  private async runAs<T>(
    asBackground: boolean,
    start: () => Promise<T>,
    signal?: AbortSignal,
    ticket?: BackgroundTicket,
  ): Promise<T> {
    signal?.throwIfAborted();
    /** The class this start holds (or asks for) its slot as; a promotion changes it once, to a create's. */
    let background = asBackground;
    let holding = false;
    let waiter: Waiter | undefined;
    ticket?.bind(() => {
      if (!background) return;
      background = false;
      if (waiter) waiter.background = false;
      // It leaves the refills' count (or their queue), which may let it or a waiting refill begin.
      if (holding) this.backgroundRunning--;
      this.admitWaiting();
    });
    try {
      if (this.canStart(background)) {
        this.take(background);
        holding = true;
      } else {
        if (!background && this.queued >= this.maxQueued) throw new StartQueueFull(this.queued);
        // The slot is taken on our behalf (as the waiter's class then) before the waiter is resolved.
        await new Promise<void>((resolve, reject) => {
          const queued: Waiter = {
            resolve: () => {
              holding = true;
              signal?.removeEventListener("abort", abandon);
              resolve();
            },
            background,
          };
          const abandon = () => {
            const index = this.waiting.indexOf(queued);
            if (index < 0) return;
            this.waiting.splice(index, 1);
            reject(signal?.reason);
          };
          signal?.addEventListener("abort", abandon, { once: true });
          waiter = queued;
          this.waiting.push(queued);
        });
      }
      try {
        return await start();
      } finally {
        this.release(background);
      }
    } finally {
      ticket?.bind(undefined);
    }
  }

  private canStart(background: boolean): boolean {
    if (this.running >= this.limit) return false;
    if (!background) return true;
    return this.backgroundRunning < this.backgroundLimit && this.queued === 0;
  }

  private take(background: boolean): void {
    this.running++;
    if (background) this.backgroundRunning++;
  }

  private release(background: boolean): void {
    this.running--;
    if (background) this.backgroundRunning--;
    this.admitWaiting();
  }

  /** Gives free slots to waiting starts: creates first, in arrival order; then refills, while their limit allows. */
  private admitWaiting(): void {
    for (;;) {
      const index = this.waiting.findIndex((w) => !w.background);
      const next = index >= 0 ? index : this.waiting.findIndex((w) => w.background);
      const waiter = this.waiting[next];
      if (!waiter || !this.canStartQueued(waiter.background)) return;
      this.waiting.splice(next, 1);
      this.take(waiter.background);
      waiter.resolve();
    }
  }

  /** canStart for a waiter already in the queue (a waiting create does not block itself). */
  private canStartQueued(background: boolean): boolean {
    if (this.running >= this.limit) return false;
    return !background || this.backgroundRunning < this.backgroundLimit;
  }
}
