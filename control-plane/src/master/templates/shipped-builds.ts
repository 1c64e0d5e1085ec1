import { randomUUID } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import type { Db } from "../../store/db.js";
import { getLiveSnapshot } from "../../store/snapshots.js";
import { SHIPPED_BUILDS_TEAM } from "../../store/teams.js";
import { BUILD_ENVD_VERSION, getBuild, getTemplate, insertBuild, storeBuildSpec } from "../../store/templates.js";
import { SHIPPED_BUILD_SPECS } from "../../templates/shipped-specs.js";
import type { Logger } from "../log.js";
import type { NodeAgentConnector } from "../node-agent-client.js";
import type { NodeRegistry } from "../node-registry.js";
import { ensureSnapshotOn } from "../snapshot-copies.js";
import type { TemplateBuilder } from "./template-builder.js";

const POLL_MS = 1000;

export interface ShippedBuildsDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly builder: TemplateBuilder;
  readonly log: Logger;
}

/**
 * Builds Warren's shipped templates with the template builder, for the node agents that take them from it
 * (node-agent/shipped-from-builder.ts): a node lists what it awaits in its heartbeat
 * (`templatesWanted`); the leader builds each one from its spec (templates/shipped-specs.ts) on that node, an
 * ordinary build of the shipped template owned by SHIPPED_BUILDS_TEAM (its steps' layers cached as any team's), and
 * hands the ready snapshot over (AdoptTemplate). A failed build or hand-over is tried again on a later pass while
 * the node still awaits the template.
 */
export class ShippedTemplateBuilds {
  /** `<nodeId>/<templateId>` → the run building and handing it over. */
  private readonly running = new Map<string, Promise<void>>();

  constructor(private readonly deps: ShippedBuildsDeps) {}

  /** One pass: starts a run for every template a live node awaits and no run serves yet. */
  async pass(): Promise<void> {
    for (const node of await this.deps.registry.liveNodes()) {
      for (const templateId of node.templatesWanted ?? []) {
        if (!Object.hasOwn(SHIPPED_BUILD_SPECS, templateId)) continue;
        const key = `${node.nodeId}/${templateId}`;
        if (this.running.has(key)) continue;
        const run = this.buildFor(node, templateId as keyof typeof SHIPPED_BUILD_SPECS)
          .catch((error) =>
            this.deps.log.warn("shipped template build for a node failed; tried again on a later pass", {
              nodeId: node.nodeId,
              templateId,
              error,
            }),
          )
          .finally(() => this.running.delete(key));
        this.running.set(key, run);
      }
    }
  }

  /** Waits for the runs in progress (master shutdown, tests). */
  async settle(): Promise<void> {
    await Promise.all(this.running.values());
  }

  private async buildFor(node: NodeHeartbeat, templateId: keyof typeof SHIPPED_BUILD_SPECS): Promise<void> {
    const { db, builder, log } = this.deps;
    const template = await getTemplate(db, templateId);
    if (!template) throw new Error(`shipped template '${templateId}' has no row`);
    await db.query("INSERT INTO teams (id, name) VALUES ($1, $1) ON CONFLICT (id) DO NOTHING", [SHIPPED_BUILDS_TEAM]);
    const build = await insertBuild(db, {
      id: randomUUID(),
      templateId,
      teamId: SHIPPED_BUILDS_TEAM,
      cpuCount: template.cpuCount,
      memoryMB: template.memoryMB,
      diskSizeMB: template.diskSizeMB,
      envdVersion: BUILD_ENVD_VERSION,
    });
    await storeBuildSpec(db, build.id, { ...SHIPPED_BUILD_SPECS[templateId], onNode: node.nodeId });
    log.info("building a shipped template for a node", { nodeId: node.nodeId, templateId, buildId: build.id });
    await builder.start(SHIPPED_BUILDS_TEAM, templateId, build.id);
    let done = await getBuild(db, build.id);
    while (done && (done.status === "building" || done.status === "waiting")) {
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      done = await getBuild(db, build.id);
    }
    if (done?.status !== "ready" || !done.snapshotId) {
      throw new Error(`build ${build.id} ended ${done?.status ?? "missing"}: ${done?.reason?.message ?? ""}`);
    }
    // Every step cached and nothing to start: the result is the cached layer, which may be on another node.
    const snapshot = await getLiveSnapshot(db, done.snapshotId);
    if (!snapshot) throw new Error(`build ${build.id}'s snapshot ${done.snapshotId} no longer exists`);
    await ensureSnapshotOn(this.deps, snapshot, node);
    await this.deps.nodeAgent(node.nodeId, node.addr).adoptTemplate(templateId, done.snapshotId, build.id);
    log.info("shipped template handed over to its node", { nodeId: node.nodeId, templateId, buildId: build.id });
  }
}
