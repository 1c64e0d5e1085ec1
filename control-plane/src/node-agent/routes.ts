import {
  CRASH_TTL_SECONDS,
  crashKey,
  DELETE_ROUTE_SCRIPT,
  heartbeatToHash,
  NODE_TTL_SECONDS,
  NODES_SET_KEY,
  type NodeHeartbeat,
  nodeKey,
  type RouteEvent,
  routeEventsChannel,
  routeFromHash,
  routeKey,
  routeKeyPattern,
  routeToHash,
  type SandboxRoute,
  sandboxIdOfRouteKey,
  WRITE_ROUTE_SCRIPT,
} from "@warren/proto/redis";
import { Redis } from "ioredis";

interface RouteCommands {
  warrenWriteRoute(
    key: string,
    channel: string,
    generation: string,
    event: string,
    ...fields: string[]
  ): Promise<number>;
  warrenDeleteRoute(key: string, channel: string, exec: string, event: string): Promise<number>;
}

/**
 * The node agent's side of the Redis contract (@warren/proto/redis): publishes its sandboxes' routes (written and
 * deleted with the contract's compare-and-set scripts), its crash records and its heartbeat. The proxy's reading
 * side is `RouteStore` (proxy/src/routes.ts).
 */
export class RoutePublisher {
  private readonly redis: Redis & RouteCommands;
  private readonly channel: string;

  /** `prefix` is WARREN_REDIS_PREFIX: keys through the client's keyPrefix, the channel and SCAN pattern by hand. */
  constructor(
    url: string,
    private readonly prefix = "",
  ) {
    this.channel = routeEventsChannel(prefix);
    const redis = new Redis(url, {
      lazyConnect: true,
      maxRetriesPerRequest: 3,
      enableOfflineQueue: true,
      keyPrefix: prefix,
    });
    // Failures surface on the commands (heartbeats log them); the connection retries by itself.
    redis.on("error", () => undefined);
    redis.defineCommand("warrenWriteRoute", { numberOfKeys: 1, lua: WRITE_ROUTE_SCRIPT });
    redis.defineCommand("warrenDeleteRoute", { numberOfKeys: 1, lua: DELETE_ROUTE_SCRIPT });
    this.redis = redis as Redis & RouteCommands;
  }

  /** Calls `listener` whenever the connection to Redis is (re-)established. */
  onReady(listener: () => void): void {
    this.redis.on("ready", listener);
  }

  async connect(): Promise<void> {
    if (this.redis.status === "wait" || this.redis.status === "end") await this.redis.connect();
  }

  /** Writes the route unless Redis holds a newer generation; true when written. */
  async write(route: SandboxRoute): Promise<boolean> {
    const event: RouteEvent = {
      sandboxId: route.sandboxId,
      exec: route.exec,
      generation: route.generation,
      state: route.state,
    };
    const fields = Object.entries(routeToHash(route)).flat();
    const written = await this.redis.warrenWriteRoute(
      routeKey(route.sandboxId),
      this.channel,
      String(route.generation),
      JSON.stringify(event),
      ...fields,
    );
    return written === 1;
  }

  /** Deletes the route if it still belongs to incarnation `exec`; true when deleted. */
  /** Says why a sandbox was found dead and removed, for the master's reconciler (`crashKey`, 10 min). */
  async recordCrash(sandboxId: string, reason: string): Promise<void> {
    await this.redis.set(crashKey(sandboxId), reason, "EX", CRASH_TTL_SECONDS);
  }

  async delete(sandboxId: string, exec: string, generation: number): Promise<boolean> {
    const event: RouteEvent = { sandboxId, exec, generation, state: "deleted" };
    const deleted = await this.redis.warrenDeleteRoute(routeKey(sandboxId), this.channel, exec, JSON.stringify(event));
    return deleted === 1;
  }

  async read(sandboxId: string): Promise<SandboxRoute | undefined> {
    return routeFromHash(await this.redis.hgetall(routeKey(sandboxId)));
  }

  /** Routes in Redis that name this node (found with SCAN; used at start to drop routes of vanished sandboxes). */
  async routesOfNode(nodeId: string): Promise<SandboxRoute[]> {
    const routes: SandboxRoute[] = [];
    let cursor = "0";
    do {
      const [next, keys] = await this.redis.scan(cursor, "MATCH", routeKeyPattern(this.prefix), "COUNT", 500);
      cursor = next;
      for (const key of keys) {
        // SCAN returns full keys; the client adds the prefix again, so read through the id.
        const sandboxId = sandboxIdOfRouteKey(key, this.prefix);
        if (sandboxId === undefined) continue;
        const route = routeFromHash(await this.redis.hgetall(routeKey(sandboxId)));
        if (route?.node === nodeId) routes.push(route);
      }
    } while (cursor !== "0");
    return routes;
  }

  /**
   * Refreshes the node's capacity hash; it expires NODE_TTL_SECONDS after the last heartbeat. Returns
   * false when the key was gone (first beat, or Redis lost its data), so the caller can republish routes.
   */
  async heartbeat(beat: NodeHeartbeat): Promise<boolean> {
    const key = nodeKey(beat.nodeId);
    const results = await this.redis
      .multi()
      .del(key)
      .hset(key, heartbeatToHash(beat))
      .expire(key, NODE_TTL_SECONDS)
      .sadd(NODES_SET_KEY, beat.nodeId)
      .exec();
    return results?.[0]?.[1] === 1;
  }

  /** Drops the node's heartbeat key (clean shutdown). */
  async removeNode(nodeId: string): Promise<void> {
    await this.redis.del(nodeKey(nodeId));
  }

  async close(): Promise<void> {
    await this.redis.quit().catch(() => this.redis.disconnect());
  }
}
