import { DELETE_ROUTE_SCRIPT, type RouteEvent, routeEventsChannel, routeKey } from "@warren/proto/redis";
import type { Redis } from "ioredis";

/**
 * The master only ever removes routes (node agents write them): when a node lost a sandbox or went down.
 * Compare-and-set on `exec`, so a newer incarnation's route is never clobbered.
 */
export async function deleteRoute(redis: Redis, sandboxId: string, exec: string): Promise<boolean> {
  const event: RouteEvent = { sandboxId, exec, generation: 0, state: "deleted" };
  const result = await redis.eval(
    DELETE_ROUTE_SCRIPT,
    1,
    routeKey(sandboxId),
    // The client prefixes keys (WARREN_REDIS_PREFIX), never channels.
    routeEventsChannel(redis.options.keyPrefix ?? ""),
    exec,
    JSON.stringify(event),
  );
  return result === 1;
}
