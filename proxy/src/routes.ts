import {
  parseRouteEvent,
  type RouteEvent,
  routeEventsChannel,
  routeFromHash,
  routeKey,
  type SandboxRoute,
} from "@warren/proto/redis";
import type { Redis } from "ioredis";
import { EventCache } from "./cache.js";
import { ChannelFollower } from "./channel-follower.js";
import type { Logger } from "./log.js";

export interface RouteStoreOptions {
  /** Cache lifetime; 0 reads Redis on every request. */
  readonly cacheTtlMs: number;
  readonly cacheMax: number;
  /** How often a waiter re-reads the route in case an event was lost. */
  readonly waitPollMs?: number;
  readonly onLookup?: (result: "hit" | "miss") => void;
}

export type RouteEventListener = (event: RouteEvent) => void;

/**
 * The proxy's view of `warren:route:<id>` (the node agents' Redis contract): cached reads,
 * invalidated by `warren:route-events`, plus a way to wait for a route to reach a state.
 * `redis` serves reads; `subscriber` is a second connection that only listens to the channel.
 * Under WARREN_REDIS_PREFIX, `redis` carries it as its keyPrefix; the channel is derived from that.
 */
export class RouteStore {
  private readonly cache: EventCache<SandboxRoute | undefined>;
  private readonly events: ChannelFollower;
  private readonly listeners = new Set<RouteEventListener>();
  private readonly waitPollMs: number;

  constructor(
    private readonly redis: Redis,
    private readonly subscriber: Redis,
    private readonly options: RouteStoreOptions,
    private readonly log: Logger,
  ) {
    this.cache = new EventCache(options.cacheTtlMs, options.cacheMax, (id) => this.read(id));
    this.waitPollMs = options.waitPollMs ?? 500;
    this.events = new ChannelFollower(
      subscriber,
      routeEventsChannel(redis.options.keyPrefix ?? ""),
      {
        message: (message) => {
          const event = parseRouteEvent(message);
          if (!event) {
            log.warn("ignoring malformed route event", { length: message.length });
            return;
          }
          this.cache.invalidate(event.sandboxId);
          for (const listener of this.listeners) listener(event);
        },
        live: (live) => this.cache.setEnabled(live),
      },
      log,
      "route events",
    );
  }

  /** Subscribes to route events; the cache serves entries only while subscribed. */
  start(): Promise<void> {
    return this.events.start();
  }

  /** A cached route when there is one (`{route: undefined}` caches "no route"). */
  peek(sandboxId: string): { readonly route: SandboxRoute | undefined } | undefined {
    const hit = this.cache.peek(sandboxId);
    this.options.onLookup?.(hit ? "hit" : "miss");
    return hit && { route: hit.value };
  }

  /** The route, from the cache or Redis. */
  get(sandboxId: string): Promise<SandboxRoute | undefined> {
    const hit = this.peek(sandboxId);
    return hit ? Promise.resolve(hit.route) : this.cache.load(sandboxId);
  }

  /** Reads Redis past the cache (and refreshes the cache with the answer). */
  fresh(sandboxId: string): Promise<SandboxRoute | undefined> {
    this.cache.invalidate(sandboxId);
    return this.cache.load(sandboxId);
  }

  /** Called for every route event, after the cache dropped the sandbox. */
  onEvent(listener: RouteEventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * Resolves with the route once `done(route)` holds, re-reading it on every event for the sandbox
   * and every `waitPollMs`; rejects with the signal's reason when it aborts first.
   */
  waitFor(
    sandboxId: string,
    done: (route: SandboxRoute | undefined) => boolean,
    signal: AbortSignal,
  ): Promise<SandboxRoute | undefined> {
    return new Promise((resolve, reject) => {
      let settled = false;
      let checking = false;
      let again = false;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearInterval(timer);
        unsubscribe();
        signal.removeEventListener("abort", onAbort);
        fn();
      };
      const check = async () => {
        if (checking) {
          again = true;
          return;
        }
        checking = true;
        try {
          do {
            again = false;
            const route = await this.fresh(sandboxId);
            if (done(route)) return finish(() => resolve(route));
          } while (again && !settled);
        } catch (error) {
          this.log.warn("route read failed while waiting", { sandboxId, error: String(error) });
        } finally {
          checking = false;
        }
      };
      const onAbort = () => finish(() => reject(signal.reason));
      const unsubscribe = this.onEvent((event) => {
        if (event.sandboxId === sandboxId) void check();
      });
      const timer = setInterval(() => void check(), this.waitPollMs);
      if (signal.aborted) return onAbort();
      signal.addEventListener("abort", onAbort, { once: true });
      void check();
    });
  }

  get cacheSize(): number {
    return this.cache.size;
  }

  async close(): Promise<void> {
    this.events.close();
    await Promise.allSettled([this.subscriber.quit(), this.redis.quit()]);
  }

  private async read(sandboxId: string): Promise<SandboxRoute | undefined> {
    const hash = await this.redis.hgetall(routeKey(sandboxId));
    return routeFromHash(hash);
  }
}
