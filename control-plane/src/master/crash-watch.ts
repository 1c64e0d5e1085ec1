import { parseRouteEvent, type RouteEvent, routeEventsChannel } from "@warren/proto/redis";
import { Redis } from "ioredis";
import type { Db } from "../store/db.js";
import { getSandbox } from "../store/sandboxes.js";
import type { SandboxLifecycle } from "./lifecycle.js";
import type { Logger } from "./log.js";
import type { NodeRegistry } from "./node-registry.js";

/**
 * The leader's fast path for dead sandboxes: a node agent whose watchdog finds a sandbox's envd dead records why
 * (`warren:crash:<id>`) and then deletes its route; this watch hears the route's `deleted` event and records the
 * sandbox lost (`sandbox.lost`, `crashed`) at once instead of at the reconciler's next pass (every 5 s by default),
 * which stays the safety net for a missed event.
 */
export class CrashWatch {
  private subscriber: Redis | undefined;
  private readonly checking = new Set<string>();

  constructor(
    private readonly deps: {
      readonly db: Db;
      readonly registry: NodeRegistry;
      readonly lifecycle: SandboxLifecycle;
      readonly log: Logger;
      readonly redisUrl: string;
      readonly keyPrefix: string;
    },
  ) {}

  start(): void {
    if (this.subscriber) return;
    const subscriber = new Redis(this.deps.redisUrl, {
      maxRetriesPerRequest: null,
      autoResubscribe: true,
      connectionName: "warren-master-crash-watch",
    });
    subscriber.on("error", () => undefined);
    subscriber.on("message", (_channel: string, message: string) => {
      const event = parseRouteEvent(message);
      if (event?.state === "deleted") void this.check(event);
    });
    subscriber.subscribe(routeEventsChannel(this.deps.keyPrefix)).catch((error: unknown) => {
      this.deps.log.warn("crash watch could not subscribe; the reconciler's pass still finds dead sandboxes", {
        error,
      });
    });
    this.subscriber = subscriber;
  }

  stop(): void {
    this.subscriber?.disconnect();
    this.subscriber = undefined;
  }

  private async check(event: RouteEvent): Promise<void> {
    if (this.checking.has(event.sandboxId)) return;
    this.checking.add(event.sandboxId);
    try {
      const crash = await this.deps.registry.crashReason(event.sandboxId);
      if (!crash) return;
      // Only the incarnation that died, while the store still says it runs: a kill, pause or move deletes routes
      // too, and none of them leaves a crash record.
      const row = await getSandbox(this.deps.db, event.sandboxId);
      if (!row || row.state !== "running" || row.execId !== event.exec) return;
      const data = { node: row.nodeId, detail: crash };
      if (await this.deps.lifecycle.markLost(event.sandboxId, "crashed", data)) {
        this.deps.log.warn("sandbox died on its node; marked lost", { sandboxId: event.sandboxId, ...data });
      }
    } catch (error) {
      this.deps.log.warn("crash watch check failed; the reconciler's pass retries", {
        sandboxId: event.sandboxId,
        error,
      });
    } finally {
      this.checking.delete(event.sandboxId);
    }
  }
}
