import { isSandboxId } from "@warren/proto/redis";
import type { RuntimeDriver } from "../runtime/driver.js";
import type { Logger } from "./log.js";
import type { RoutePublisher } from "./routes.js";
import { type SandboxSummary, type sandboxRoute, summaryOf } from "./sandbox-model.js";
import type { SandboxPauses } from "./sandbox-pauses.js";

export interface AdoptionDeps {
  readonly driver: RuntimeDriver;
  readonly routes: RoutePublisher;
  /** The agent's sandboxes by id, filled here. */
  readonly sandboxes: Map<string, SandboxSummary>;
  readonly pauses: SandboxPauses;
  readonly routeOf: (summary: SandboxSummary) => ReturnType<typeof sandboxRoute>;
  readonly nodeId: string;
  readonly log: Logger;
}

/**
 * At start: the driver re-adopts the instances a previous agent left running (reconcile); each initialised one is
 * this node's sandbox again (its checkpoint rescheduled when it is frozen), its route rewritten unless Redis holds a
 * newer incarnation; warm instances of the previous agent are removed; routes of this node that no sandbox owns
 * any more are deleted.
 */
export async function adoptSandboxes(deps: AdoptionDeps): Promise<void> {
  const { driver, routes, sandboxes, pauses, routeOf, nodeId, log } = deps;
  const { adopted, removed } = await driver.reconcile();
  let pooledRemoved = 0;
  for (const instance of adopted) {
    const summary = summaryOf(instance);
    if (!summary || !isSandboxId(summary.sandboxId)) {
      // A warm sandbox of the previous agent (never initialised, cheaper to replace than to track), or one whose
      // id the route contract no longer accepts.
      await driver.kill(instance.instanceId);
      pooledRemoved++;
      continue;
    }
    sandboxes.set(summary.sandboxId, summary);
    if (instance.paused && !instance.checkpointed && !instance.stopped) pauses.scheduleCheckpoint(summary.sandboxId);
    const route = await routes.read(summary.sandboxId);
    if (!route || route.exec === summary.exec) await routes.write(routeOf(summary));
  }
  for (const { labels } of removed) {
    if (labels.sandboxId && labels.exec && isSandboxId(labels.sandboxId)) {
      await routes.delete(labels.sandboxId, labels.exec, Number(labels.generation ?? 0));
    }
  }
  for (const route of await routes.routesOfNode(nodeId)) {
    if (!isSandboxId(route.sandboxId)) {
      log.warn("route with an id the contract rejects left in Redis", { sandboxId: route.sandboxId });
    } else if (sandboxes.get(route.sandboxId)?.exec !== route.exec) {
      await routes.delete(route.sandboxId, route.exec, route.generation);
    }
  }
  log.info("reconciled sandboxes after start", {
    adopted: sandboxes.size,
    removed: removed.map((r) => r.labels.sandboxId || r.instanceId),
    pooledRemoved,
  });
}
