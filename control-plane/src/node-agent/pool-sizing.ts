/**
 * How many ready sandboxes a template's warm pool keeps: as many as the node saw creates claim from it over the
 * recent window, bounded by a configured floor and ceiling.
 *
 * The demand is an exponentially weighted rate of claims (each claim adds 1/window per second, and the rate decays
 * with time constant `window`), so `rate × window` is the decayed count of claims in about the last window. Why not
 * `rate × start time` (what is in flight at a steady rate, by Little's law): that is one or two sandboxes here,
 * and a pool exists for bursts, which on a 2-core node arrive faster than cold starts can follow (a start takes
 * ~300 ms of a core; a pooled create ~40 ms). A pool that held the last window's claims serves the next burst of
 * the same size from the pool while refills catch up; quiet templates shrink back to the floor within a few
 * windows.
 */
export interface PoolSizing {
  /** Ready sandboxes kept whatever the demand (WARREN_POOL_SIZE). */
  readonly floor: number;
  /** Never more than this, whatever the demand (WARREN_POOL_MAX). */
  readonly ceiling: number;
  /** The demand's time constant and horizon, ms (WARREN_POOL_WINDOW_MS). */
  readonly windowMs: number;
}

/** A fixed-size pool (tests, and a ceiling at the floor). */
export function fixedSizing(size: number): PoolSizing {
  return { floor: size, ceiling: size, windowMs: 60_000 };
}

/** Claims per second, exponentially weighted with time constant `windowMs`. */
export class DemandRate {
  private rate = 0;
  private at = 0;

  constructor(private readonly windowMs: number) {
    if (!(windowMs > 0)) throw new Error(`demand window must be positive, got ${windowMs}`);
  }

  /** A claim at `now` (ms). */
  record(now: number): void {
    this.rate = this.perSecond(now) + 1000 / this.windowMs;
    this.at = now;
  }

  /** The rate at `now` (ms), decayed since the last claim. */
  perSecond(now: number): number {
    if (this.rate === 0) return 0;
    return this.rate * Math.exp(-Math.max(0, now - this.at) / this.windowMs);
  }
}

/** The pool's target size for a demand of `ratePerSecond`. */
export function poolTarget(ratePerSecond: number, sizing: PoolSizing): number {
  const ceiling = Math.max(sizing.floor, sizing.ceiling);
  // The decayed count of recent claims, rounded: one claim long ago no longer keeps a sandbox warm.
  const demand = Math.round(ratePerSecond * (sizing.windowMs / 1000));
  return Math.min(ceiling, Math.max(sizing.floor, demand));
}
