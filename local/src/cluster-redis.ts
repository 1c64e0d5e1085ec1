import { NODES_SET_KEY, nodeKey, parseRedisPrefix, routeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";

/**
 * What the local cluster reads of its Redis directly, through the contract's keys (`@warren/proto/redis`): the
 * node agents' heartbeats (which templates are ready where) and sandboxes' routes (which node runs one). Each read
 * opens its own short connection, so a test that restarts Redis on purpose leaves nothing stale behind.
 */
export class ClusterRedis {
  constructor(
    private readonly url: string,
    /** `WARREN_REDIS_PREFIX` of the cluster's processes, if any. */
    private readonly prefix: string | undefined,
  ) {}

  /** How many node agents' heartbeats list `templateId` among their ready templates. */
  async nodesWithTemplate(templateId: string): Promise<number> {
    const redis = new Redis(this.url, {
      lazyConnect: true,
      maxRetriesPerRequest: 1,
      keyPrefix: parseRedisPrefix(this.prefix),
    });
    redis.on("error", () => undefined);
    try {
      await redis.connect();
      let count = 0;
      for (const nodeId of await redis.smembers(NODES_SET_KEY)) {
        const templates = await redis.hget(nodeKey(nodeId), "templates");
        if (templates && (JSON.parse(templates) as string[]).includes(templateId)) count++;
      }
      return count;
    } finally {
      redis.disconnect();
    }
  }

  /** The node a sandbox's route names ("" when it has none, e.g. while paused on no node). */
  async nodeOf(sandboxId: string): Promise<string> {
    const redis = new Redis(this.url, {
      maxRetriesPerRequest: 1,
      keyPrefix: parseRedisPrefix(this.prefix),
    });
    redis.on("error", () => undefined); // a test may restart Redis on purpose; callers retry
    try {
      return (await redis.hget(routeKey(sandboxId), "node")) ?? "";
    } finally {
      redis.disconnect();
    }
  }
}
