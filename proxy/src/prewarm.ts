import type { RouteEvent } from "@warren/proto/redis";
import { admit } from "./admission.js";
import type { ProxyConfig } from "./config.js";
import type { Forwarder } from "./forward.js";
import type { ProxyMetrics } from "./metrics.js";
import type { RouteStore } from "./routes.js";

// A burst of creates prewarms this many sandboxes at once; the rest connect on their first request, as without.
const MAX_IN_FLIGHT = 32;

export interface EnvdPrewarmerDeps {
  readonly config: Pick<ProxyConfig, "envdPort" | "relay" | "nodeId">;
  readonly routes: RouteStore;
  readonly forwarder: Forwarder;
  readonly metrics: ProxyMetrics;
}

/**
 * Readies the path of a sandbox's first command before it arrives. A create's route is written a few milliseconds
 * before the SDK has the create's answer, and its first command then paid a route read from Redis and a new
 * connection to envd (its first request on a connection, too): ~4–5 ms of a ~25 ms `commands.run` on this
 * machine's kind. When a route turns `running` (a create or a resume), this reads the route into the cache and
 * opens a kept-alive connection to its envd with a `GET /health`, the pool the first request then takes. Only
 * sandboxes this proxy reaches directly: a tunnel through another node's relay per sandbox would cost that node
 * more than it saves here.
 */
export class EnvdPrewarmer {
  private inFlight = 0;

  constructor(private readonly deps: EnvdPrewarmerDeps) {}

  onRouteEvent(event: RouteEvent): void {
    if (event.state !== "running") return;
    if (this.inFlight >= MAX_IN_FLIGHT) {
      this.deps.metrics.prewarms.inc({ outcome: "skipped" });
      return;
    }
    this.inFlight += 1;
    void this.prewarm(event)
      .then((outcome) => this.deps.metrics.prewarms.inc({ outcome }))
      .finally(() => {
        this.inFlight -= 1;
      });
  }

  private async prewarm(event: RouteEvent): Promise<"opened" | "skipped" | "failed"> {
    const { config, routes, forwarder } = this.deps;
    let route: Awaited<ReturnType<RouteStore["get"]>>;
    try {
      route = await routes.get(event.sandboxId);
    } catch {
      return "failed";
    }
    // A later incarnation (or a kill) overtook this event: its own event prewarms what is there now.
    if (!route || route.exec !== event.exec || route.state !== "running") return "skipped";
    const admission = admit(
      config,
      { sandboxId: event.sandboxId, port: config.envdPort, via: "headers" },
      route,
      {},
      false,
    );
    // The forwarder skips an upstream behind a relay.
    if (!("upstream" in admission)) return "skipped";
    return forwarder.prewarm(admission.upstream, "/health");
  }
}
