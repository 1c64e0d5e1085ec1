import type { SandboxRoute } from "@warren/proto/redis";

/** A cached lookup: `route` undefined means "no route" (cached too, so floods of dead ids stay cheap). */
export interface CachedRoute {
  readonly route: SandboxRoute | undefined;
}

interface Entry extends CachedRoute {
  readonly expiresAt: number;
}

/**
 * Routes by sandbox id, kept at most `ttlMs` and dropped the moment a route event names the
 * sandbox. A lookup that was in flight when such an event arrived is not cached (it may have read
 * the route before the write the event announces), and requests arriving after the event do not
 * join it: they start a fresh read. So once a proxy has seen the event for a new incarnation, it
 * never serves the old one again.
 *
 * Concurrent misses for one sandbox share a single read.
 */
export class RouteCache {
  private readonly entries = new Map<string, Entry>();
  private readonly pending = new Map<string, Promise<SandboxRoute | undefined>>();
  private enabled = false;

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
    private readonly fetch: (sandboxId: string) => Promise<SandboxRoute | undefined>,
    private readonly now: () => number = Date.now,
  ) {}

  /** The cache serves entries only while the event stream that invalidates them is live. */
  setEnabled(enabled: boolean): void {
    this.enabled = enabled && this.ttlMs > 0;
    this.clear();
  }

  /** A cached lookup, or undefined on a miss. */
  peek(sandboxId: string): CachedRoute | undefined {
    const entry = this.entries.get(sandboxId);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now()) {
      this.entries.delete(sandboxId);
      return undefined;
    }
    return entry;
  }

  /** Reads the route (sharing a read already in flight) and caches it unless invalidated meanwhile. */
  load(sandboxId: string): Promise<SandboxRoute | undefined> {
    const inFlight = this.pending.get(sandboxId);
    if (inFlight) return inFlight;
    const read = this.fetch(sandboxId).then(
      (route) => {
        if (this.pending.get(sandboxId) === read) {
          this.pending.delete(sandboxId);
          if (this.enabled) this.store(sandboxId, route);
        }
        return route;
      },
      (error: unknown) => {
        if (this.pending.get(sandboxId) === read) this.pending.delete(sandboxId);
        throw error;
      },
    );
    this.pending.set(sandboxId, read);
    return read;
  }

  invalidate(sandboxId: string): void {
    this.entries.delete(sandboxId);
    this.pending.delete(sandboxId);
  }

  clear(): void {
    this.entries.clear();
    this.pending.clear();
  }

  get size(): number {
    return this.entries.size;
  }

  private store(sandboxId: string, route: SandboxRoute | undefined): void {
    if (this.entries.size >= this.maxEntries) {
      // Maps iterate in insertion order: the first key is the oldest entry.
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.entries.delete(oldest.value);
    }
    this.entries.set(sandboxId, { route, expiresAt: this.now() + this.ttlMs });
  }
}
