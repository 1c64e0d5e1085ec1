/**
 * Work that can wait for a quiet moment: a killed sandbox's teardown (umount, `ip`, `iptables`, file removal:
 * ~100 ms of host tools), which otherwise shares the node's CPU with the creates and first commands that come right
 * after the kill. Items run one at a time, once `quietMs` pass without `activity()` (a create, a kill), and never
 * later than `maxDelayMs` after the oldest one waiting, so a node that is never quiet still reclaims.
 * `settled()` runs what waits at once and resolves when all of it has run.
 */
export interface QuietReclaimOptions {
  /** Time without activity before waiting items run. */
  readonly quietMs: number;
  /** Longest an item waits, however busy the node. */
  readonly maxDelayMs: number;
  /** Clock, ms (tests). */
  readonly now?: () => number;
}

export class QuietReclaim<T> {
  private readonly waiting: { readonly item: T; readonly since: number }[] = [];
  private lastActivity = Number.NEGATIVE_INFINITY;
  private timer: NodeJS.Timeout | undefined;
  /** The run under way, if any (items run one after another). */
  private running: Promise<void> | undefined;
  private readonly now: () => number;

  constructor(
    private readonly options: QuietReclaimOptions,
    private readonly run: (item: T) => Promise<void>,
  ) {
    this.now = options.now ?? Date.now;
  }

  /** Items waiting or running (tests, metrics). */
  get pending(): number {
    return this.waiting.length + (this.running ? 1 : 0);
  }

  add(item: T): void {
    this.waiting.push({ item, since: this.now() });
    this.lastActivity = this.now();
    this.arm();
  }

  /** The node is busy now (a create, a kill): waiting items wait a little longer, within `maxDelayMs`. */
  activity(): void {
    this.lastActivity = this.now();
  }

  /** Runs every waiting item now; resolves once none waits or runs. */
  async settled(): Promise<void> {
    while (this.waiting.length > 0 || this.running) {
      this.drain();
      await this.running;
    }
  }

  /** When the waiting items are due: a quiet moment, or the oldest one's longest wait. */
  private dueAt(): number {
    const oldest = this.waiting[0]?.since ?? this.now();
    return Math.min(this.lastActivity + this.options.quietMs, oldest + this.options.maxDelayMs);
  }

  private arm(): void {
    if (this.timer || this.running || this.waiting.length === 0) return;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        // Activity since the timer was set moved the quiet moment on.
        if (this.now() < this.dueAt()) this.arm();
        else this.drain();
      },
      Math.max(0, this.dueAt() - this.now()),
    );
    this.timer.unref();
  }

  private drain(): void {
    // One run at a time: a timer armed before settled() started one finds it under way.
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.running) return;
    this.running = (async () => {
      // `run` reports its own failures; one that throws anyway must not stop the others.
      for (let next = this.waiting.shift(); next; next = this.waiting.shift()) {
        await this.run(next.item).catch(() => undefined);
      }
    })().finally(() => {
      this.running = undefined;
      this.arm();
    });
  }
}
