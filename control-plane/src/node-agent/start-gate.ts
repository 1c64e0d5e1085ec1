/**
 * A counting gate for cold sandbox starts. Starting a sandbox is CPU-bound (crun, mounts, envd's own start); a
 * burst of a hundred creates on a small node started all at once makes every one of them slow, past the ready
 * deadline, instead of most of them fast. Creates beyond the limit wait in order for a free slot.
 */
export class StartGate {
  private running = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly limit: number) {
    if (!Number.isInteger(limit) || limit < 1)
      throw new Error(`start gate limit must be a positive integer, got ${limit}`);
  }

  /** Creates waiting for a slot now (metrics, tests). */
  get queued(): number {
    return this.waiting.length;
  }

  async run<T>(start: () => Promise<T>): Promise<T> {
    if (this.running >= this.limit) await new Promise<void>((resolve) => this.waiting.push(resolve));
    else this.running++;
    try {
      return await start();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}
