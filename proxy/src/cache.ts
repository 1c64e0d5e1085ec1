/** A cached lookup: `value` may itself mean "nothing there" (cached too, so floods of dead ids stay cheap). */
export interface Cached<V> {
  readonly value: V;
}

interface Entry<V> extends Cached<V> {
  readonly expiresAt: number;
}

/**
 * Values read from Redis by key, kept at most `ttlMs` and dropped the moment an event names the key (routes by
 * sandbox id on route events, exec policies by team on policy events). A read that was in flight when such an
 * event arrived is not cached (it may have read the value before the write the event announces), and requests
 * arriving after the event do not join it: they start a fresh read. So once a proxy has seen the event for a new
 * value, it never serves the old one again.
 *
 * Concurrent misses for one key share a single read.
 */
export class EventCache<V> {
  private readonly entries = new Map<string, Entry<V>>();
  private readonly pending = new Map<string, Promise<V>>();
  private enabled = false;

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
    private readonly fetch: (key: string) => Promise<V>,
    private readonly now: () => number = Date.now,
  ) {}

  /** The cache serves entries only while the event stream that invalidates them is live. */
  setEnabled(enabled: boolean): void {
    this.enabled = enabled && this.ttlMs > 0;
    this.clear();
  }

  /** A cached value, or undefined on a miss. */
  peek(key: string): Cached<V> | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return entry;
  }

  /** Reads the value (sharing a read already in flight) and caches it unless invalidated meanwhile. */
  load(key: string): Promise<V> {
    const inFlight = this.pending.get(key);
    if (inFlight) return inFlight;
    const read = this.fetch(key).then(
      (value) => {
        if (this.pending.get(key) === read) {
          this.pending.delete(key);
          if (this.enabled) this.store(key, value);
        }
        return value;
      },
      (error: unknown) => {
        if (this.pending.get(key) === read) this.pending.delete(key);
        throw error;
      },
    );
    this.pending.set(key, read);
    return read;
  }

  /** The cached value, or a read of it. */
  get(key: string): Promise<V> {
    const hit = this.peek(key);
    return hit ? Promise.resolve(hit.value) : this.load(key);
  }

  invalidate(key: string): void {
    this.entries.delete(key);
    this.pending.delete(key);
  }

  clear(): void {
    this.entries.clear();
    this.pending.clear();
  }

  get size(): number {
    return this.entries.size;
  }

  private store(key: string, value: V): void {
    if (this.entries.size >= this.maxEntries) {
      // Maps iterate in insertion order: the first key is the oldest entry.
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.entries.delete(oldest.value);
    }
    this.entries.set(key, { value, expiresAt: this.now() + this.ttlMs });
  }
}
