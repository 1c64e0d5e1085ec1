import { cpus, freemem, totalmem } from "node:os";
import type { RuntimeDriver } from "../runtime/driver.js";
import { driverServes } from "../templates/catalog.js";
import type { TemplateStore } from "../templates/store.js";
import type { NodeAgentConfig } from "./config.js";
import type { Logger } from "./log.js";
import type { RoutePublisher } from "./routes.js";
import type { NodeInfo, SandboxSummary, sandboxRoute } from "./sandbox-model.js";
import type { SnapshotPools } from "./snapshot-pools.js";
import type { TemplateBuilds } from "./template-builds.js";

export interface NodeHeartbeatDeps {
  readonly config: Pick<NodeAgentConfig, "nodeId" | "nodeAddr" | "heartbeatMs">;
  readonly driver: RuntimeDriver;
  readonly templates: TemplateStore;
  readonly builds: Pick<TemplateBuilds, "readyCounts" | "trimPools">;
  readonly snapshotPools: Pick<SnapshotPools, "trim">;
  readonly routes: RoutePublisher;
  /** The agent's sandboxes by id (counted, and their routes republished when Redis lost them). */
  readonly sandboxes: ReadonlyMap<string, SandboxSummary>;
  readonly routeOf: (summary: SandboxSummary) => ReturnType<typeof sandboxRoute>;
  readonly isDraining: () => boolean;
  /** Shipped templates awaited from the master's template builder; absent: a node that cannot take them. */
  readonly templatesWanted?: () => string[];
  readonly log: Logger;
}

/**
 * The node's heartbeat: every `heartbeatMs`, its capacity, warm pools and templates for the master's scheduler
 * (a Redis hash with a TTL). Each beat also trims pools whose demand faded, and when it finds its key gone (Redis
 * restarted empty) republishes every route, since Redis lost those too.
 */
export class NodeHeartbeat {
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly deps: NodeHeartbeatDeps) {}

  /** Beats once now, then every `heartbeatMs`, and at once whenever Redis is back after an outage. */
  async start(): Promise<void> {
    await this.beat();
    this.timer = setInterval(() => void this.beat(), this.deps.config.heartbeatMs);
    this.timer.unref();
    // Back from a Redis outage (a restart loses every key): beat and republish at once, not a period later,
    // so the master does not see the node as gone meanwhile.
    this.deps.routes.onReady(() => {
      if (!this.deps.isDraining()) void this.beat();
    });
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  /** What the node reports of itself. */
  info(): NodeInfo {
    const { config, driver, templates } = this.deps;
    return {
      nodeId: config.nodeId,
      addr: config.nodeAddr,
      driver: driver.name,
      cpuCount: cpus().length,
      memoryTotalBytes: totalmem(),
      memoryFreeBytes: freemem(),
      sandboxes: this.deps.sandboxes.size,
      pools: this.deps.builds.readyCounts(),
      templates: templates.ids().filter((id) => templates.ready(id)),
      servable: templates.ids().filter((id) => driverServes(templates.recipe(id), driver.name)),
      ...(this.deps.templatesWanted ? { templatesWanted: this.deps.templatesWanted() } : {}),
    };
  }

  private async beat(): Promise<void> {
    const { routes } = this.deps;
    if (!this.deps.isDraining()) {
      // Pools whose demand faded give their extra sandboxes back.
      this.deps.builds.trimPools();
      void this.deps.snapshotPools.trim();
    }
    try {
      const info = this.info();
      const known = await routes.heartbeat({ ...info, updatedAt: Date.now() });
      // Redis lost our key (restarted without persistence): it lost our routes too. Writes are
      // compare-and-set by generation, so republishing can never clobber a newer incarnation.
      if (!known) for (const summary of this.deps.sandboxes.values()) await routes.write(this.deps.routeOf(summary));
    } catch (error) {
      this.deps.log.warn("heartbeat failed", { error });
    }
  }
}
