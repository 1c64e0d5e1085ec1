import { randomBytes } from "node:crypto";
import type { Db } from "../../store/db.js";
import { getLiveSnapshot, insertSnapshot, setSnapshotDigest, snapshotHolders } from "../../store/snapshots.js";
import type { BuildContext, BuildRecord } from "../../store/templates.js";
import type { NodeAgentConnector } from "../node-agent-client.js";
import type { NodeRegistry } from "../node-registry.js";
import type { BuildLog } from "./build-log.js";
import type { PlacedBuild } from "./build-sandbox.js";
import { PhaseError } from "./phase-error.js";
import type { TemplateBuildConfig } from "./template-builder.js";

export interface BuildSnapshotsDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly config: Pick<TemplateBuildConfig, "sandboxDiskMB">;
}

/**
 * What a build leaves: snapshots of its sandbox recorded as `snapshots` rows (a step's files-only `layer`, the
 * ready `template`), published to the cluster's store so no template lives on one node's disk only; and whether a
 * cached layer can still be used.
 */
export class BuildSnapshots {
  constructor(private readonly deps: BuildSnapshotsDeps) {}

  /** Whether a snapshot can still be used: a live node holds it, or it was published to the store. */
  async reachable(snapshotId: string): Promise<boolean> {
    const row = await getLiveSnapshot(this.deps.db, snapshotId);
    if (!row) return false;
    if (row.digest) return true;
    const holders = await snapshotHolders(this.deps.db, row);
    return (await this.deps.registry.liveNodes()).some((n) => holders.has(n.nodeId));
  }

  /**
   * Snapshots the build sandbox and records the snapshot (so the node sweep keeps it): a step's `layer` (files
   * only) or the ready `template` (memory where the node's driver keeps it).
   */
  async capture(
    build: BuildRecord,
    placed: PlacedBuild,
    context: BuildContext,
    kind: "layer" | "template",
    metadata: Record<string, string>,
  ): Promise<{ id: string; nodeId: string; memory: boolean }> {
    const id = `${kind === "layer" ? "l" : "t"}${randomBytes(10).toString("hex")}`;
    const made = await placed.node.snapshot(build.buildSandboxId as string, id, { filesOnly: kind === "layer" });
    await insertSnapshot(this.deps.db, {
      id,
      teamId: build.teamId,
      name: null,
      kind,
      sourceSandboxId: build.buildSandboxId as string,
      nodeId: placed.nodeId,
      templateId: made.templateId,
      driver: made.driver,
      memory: made.memory,
      sizeBytes: made.sizeBytes,
      cpuCount: build.cpuCount,
      memoryMB: build.memoryMB,
      diskSizeMB: this.deps.config.sandboxDiskMB,
      envVars: { ...context.env },
      metadata,
    });
    return { id, nodeId: placed.nodeId, memory: made.memory };
  }

  /**
   * Publishes a build's snapshot to the cluster's store, so any node of the driver can start sandboxes (or child
   * builds) from it; a failure fails the build (nothing a user relies on may live on one node's disk only).
   */
  async publish(
    placed: Pick<PlacedBuild, "node" | "nodeId">,
    snapshotId: string,
    build: BuildRecord,
    kind: "template" | "layer",
    buildLog: BuildLog,
  ): Promise<void> {
    const row = await getLiveSnapshot(this.deps.db, snapshotId);
    if (row?.digest) return;
    let published: { digest: string; sizeBytes: number };
    try {
      published = await placed.node.publishSnapshot(snapshotId, {
        "dev.warren.kind": kind,
        "dev.warren.template": build.templateId,
        "dev.warren.build": build.id,
      });
    } catch (error) {
      throw new PhaseError("finalize", `publishing the ${kind} to the store failed: ${(error as Error).message}`);
    }
    await setSnapshotDigest(this.deps.db, snapshotId, published.digest);
    buildLog.info(
      `[finalize] ${kind === "template" ? "ready snapshot" : "filesystem"} published to the store (${published.digest.slice(0, 19)}…, ${Math.round(published.sizeBytes / 2 ** 20)} MiB)`,
      "finalize",
    );
  }

  /** A cached layer not yet in the store, published from a live node holding it (a build that started nothing). */
  async publishFromHolder(snapshotId: string, build: BuildRecord, buildLog: BuildLog): Promise<void> {
    const { db, registry, nodeAgent } = this.deps;
    const row = await getLiveSnapshot(db, snapshotId);
    const holders = row ? await snapshotHolders(db, row) : new Set<string>();
    const holder = (await registry.liveNodes()).find((n) => holders.has(n.nodeId));
    if (row && !row.digest && holder) {
      await this.publish(
        { node: nodeAgent(holder.nodeId, holder.addr), nodeId: holder.nodeId },
        row.id,
        build,
        "layer",
        buildLog,
      );
    }
  }
}
