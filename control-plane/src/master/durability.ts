import { randomBytes } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import { type Db, type DbClient, withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { reservedMemoryByNode } from "../store/nodes.js";
import { lockSandbox, type SandboxRow } from "../store/sandboxes.js";
import {
  getLiveSnapshot,
  insertSnapshot,
  markSnapshotDeleted,
  packBaseFor,
  type SnapshotRow,
  setSnapshotDigest,
  unpublishedSnapshots,
} from "../store/snapshots.js";
import type { Logger } from "./log.js";
import type { NodeAgentConnector, SandboxPlacement } from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";
import { type RecentPlacements, rankNodes } from "./placement.js";
import { nodeCreateRequest } from "./relocation.js";
import { ensureSnapshotOn } from "./snapshot-copies.js";
import type { TokenIssuer } from "./tokens.js";

export interface DurabilityDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly tokens: TokenIssuer;
  readonly log: Logger;
  readonly memoryOvercommit: number;
}

/**
 * A killed sandbox's durable snapshots go with it, at once: their rows (marked deleted in the kill's transaction),
 * then their files on the nodes that made them (deleteDroppedSnapshotFiles; best effort: the node sweep removes
 * what a down node keeps, and pulled copies). Answers what the nodes hold.
 */
export async function markDurableSnapshotsDropped(
  db: Db | DbClient,
  sandboxId: string,
): Promise<readonly DroppedSnapshot[]> {
  const dropped = await db.query<{ id: string; node_id: string }>(
    `UPDATE snapshots SET deleted_at = now()
     WHERE kind = 'durable' AND source_sandbox_id = $1 AND deleted_at IS NULL RETURNING id, node_id`,
    [sandboxId],
  );
  return dropped.rows.map((row) => ({ snapshotId: row.id, nodeId: row.node_id }));
}

export interface DroppedSnapshot {
  readonly snapshotId: string;
  readonly nodeId: string;
}

/** The files of dropped durable snapshots, removed from the nodes that made them (once their rows committed). */
export async function deleteDroppedSnapshotFiles(
  deps: Pick<DurabilityDeps, "registry" | "nodeAgent" | "log">,
  dropped: readonly DroppedSnapshot[],
): Promise<void> {
  if (dropped.length === 0) return;
  const live = await deps.registry.liveNodes();
  for (const { snapshotId, nodeId } of dropped) {
    const node = live.find((n) => n.nodeId === nodeId);
    if (!node) continue;
    await deps
      .nodeAgent(node.nodeId, node.addr)
      .deleteSnapshot(snapshotId)
      .catch((error) => deps.log.warn("deleting a durable snapshot failed", { snapshotId, error: String(error) }));
  }
}

/** Work per pass, so one pass never holds the leader for long on a node that pauses hundreds at once. */
const PER_PASS = 4;

/**
 * Paused sandboxes and snapshots that outlive their node. The leader's pass (every reconcile interval):
 *  - a paused sandbox whose last pause has no published snapshot gets one: a capture of the paused sandbox on its
 *    node under the row lock (files, and memory where the node's driver keeps it), published to the cluster's
 *    store, then recorded as the sandbox's `durable_snapshot_id` if it is still that pause (else dropped). The
 *    previous one is deleted (node sweep and store collection remove the files);
 *  - a team snapshot not yet in the store is published;
 *  - the durable snapshots of ended sandboxes are deleted.
 * `resumeFromStore` then starts a paused sandbox whose node is gone on another node of the same driver, same id
 * and tokens, from its durable snapshot pulled from the store (digest checked).
 */
export class Durability {
  constructor(private readonly deps: DurabilityDeps) {}

  async pass(): Promise<void> {
    const { db, log } = this.deps;
    const ended = await db.query<{ id: string }>(
      `UPDATE snapshots s SET deleted_at = now() FROM sandboxes x
       WHERE s.kind = 'durable' AND s.deleted_at IS NULL AND x.id = s.source_sandbox_id
         AND (x.state IN ('killed', 'failed') OR x.durable_snapshot_id IS DISTINCT FROM s.id)
         AND s.created_at < now() - interval '10 minutes'
       RETURNING s.id`,
    );
    if (ended.rows.length > 0) log.info("durable snapshots of ended sandboxes deleted", { count: ended.rows.length });
    const due = await db.query<{ id: string }>(
      `SELECT x.id FROM sandboxes x LEFT JOIN snapshots s ON s.id = x.durable_snapshot_id
       WHERE x.state = 'paused' AND (s.id IS NULL OR s.digest IS NULL OR s.created_at < x.paused_at)
         AND x.node_id IN (SELECT id FROM nodes WHERE state = 'up')
       ORDER BY random() LIMIT $1`,
      [PER_PASS],
    );
    for (const { id } of due.rows) {
      await this.makeDurable(id).catch((error) =>
        log.warn("making a paused sandbox durable failed", { sandboxId: id, error: String(error) }),
      );
    }
    for (const snapshot of await unpublishedSnapshots(db, PER_PASS)) {
      await this.publish(snapshot, { kind: "snapshot" }).catch((error) =>
        log.warn("publishing a snapshot failed", { snapshotId: snapshot.id, error: String(error) }),
      );
    }
  }

  /** Captures and publishes the paused sandbox; records it only if it is still the same pause. */
  private async makeDurable(sandboxId: string): Promise<void> {
    const { db, registry, nodeAgent, log } = this.deps;
    const startedAt = performance.now();
    const captured = await withTransaction(
      db,
      async (tx) => {
        const row = await lockSandbox(tx, sandboxId);
        if (!row || row.state !== "paused" || !row.nodeId) return undefined;
        const node = (await registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
        if (!node) return undefined;
        const snapshotId = `d${randomBytes(10).toString("hex")}`;
        const made = await nodeAgent(node.nodeId, node.addr).snapshot(sandboxId, snapshotId);
        const { row: snapshot } = await insertSnapshot(tx, {
          id: snapshotId,
          teamId: row.teamId,
          name: null,
          kind: "durable",
          sourceSandboxId: row.id,
          nodeId: node.nodeId,
          templateId: made.templateId,
          driver: made.driver,
          memory: made.memory,
          sizeBytes: made.sizeBytes,
          cpuCount: row.cpuCount,
          memoryMB: row.memoryMB,
          diskSizeMB: row.diskSizeMB,
          envVars: row.envVars,
          metadata: row.metadata,
        });
        return { snapshot, pausedAt: row.pausedAt, previous: await packBaseFor(tx, sandboxId) };
      },
      { lockTimeoutMs: 5_000 },
    );
    if (!captured) return;
    const { snapshot, pausedAt, previous } = captured;
    // The sandbox's last durable copy (kept in the store a while after it resumed), else its template's ready
    // snapshot, is the base this one is packed against: it moves what changed since.
    const labels = { kind: "durable", sandbox: sandboxId, ...(previous ? { base: previous } : {}) };
    const digest = await this.publish(snapshot, labels).catch(async (error) => {
      await markSnapshotDeleted(db, snapshot.id);
      throw error;
    });
    const recorded = await withTransaction(db, async (tx) => {
      const row = await lockSandbox(tx, sandboxId);
      if (!row || row.state !== "paused" || row.pausedAt?.getTime() !== pausedAt?.getTime()) return undefined;
      const previous = row.durableSnapshotId;
      await tx.query("UPDATE sandboxes SET durable_snapshot_id = $2 WHERE id = $1", [sandboxId, snapshot.id]);
      if (previous) await markSnapshotDeleted(tx, previous);
      await appendEvent(tx, {
        sandboxId,
        teamId: row.teamId,
        type: "sandbox.durable",
        data: { snapshotId: snapshot.id, digest, memory: snapshot.memory, sizeBytes: snapshot.sizeBytes },
      });
      return row;
    });
    if (!recorded) {
      // Resumed (or killed) meanwhile: this capture is of a pause that is over.
      await markSnapshotDeleted(db, snapshot.id);
      return;
    }
    log.info("paused sandbox durable", {
      sandboxId,
      snapshotId: snapshot.id,
      memory: snapshot.memory,
      sizeMiB: Math.round(snapshot.sizeBytes / 2 ** 20),
      ms: Math.round(performance.now() - startedAt),
    });
  }

  /** Publishes a snapshot from its node to the store; resolves with the digest. */
  private async publish(snapshot: SnapshotRow, labels: Record<string, string>): Promise<string> {
    const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === snapshot.nodeId);
    if (!node) throw new Error(`node ${snapshot.nodeId} holding snapshot ${snapshot.id} is not heartbeating`);
    const published = await this.deps.nodeAgent(node.nodeId, node.addr).publishSnapshot(snapshot.id, labels);
    await setSnapshotDigest(this.deps.db, snapshot.id, published.digest);
    return published.digest;
  }

  /**
   * Starts `row` (paused) from its durable snapshot: on `options.node` (a move off a live node that takes no
   * sandboxes now), else on the best placeable node of the snapshot's driver (its node is gone). Undefined when the
   * pause is not durable (yet), or `options.memory` asks for processes its snapshot did not keep. Throws when no
   * node can take it.
   */
  async resumeFromStore(
    row: SandboxRow,
    recentPlacements: RecentPlacements,
    options: { readonly node?: NodeHeartbeat; readonly memory?: boolean } = {},
  ): Promise<{ placement: SandboxPlacement; node: NodeHeartbeat } | undefined> {
    const { db, registry, nodeAgent, tokens, log } = this.deps;
    const snapshot = row.durableSnapshotId ? await getLiveSnapshot(db, row.durableSnapshotId) : undefined;
    if (!snapshot?.digest || (options.memory && !snapshot.memory)) return undefined;
    let node = options.node;
    if (!node) {
      const placeable = (await registry.placeableNodes()).filter((n) => n.driver === snapshot.driver);
      const reserved = await reservedMemoryByNode(db);
      node = rankNodes(
        placeable,
        reserved,
        { templateId: row.templateId, memoryMB: row.memoryMB },
        { memoryOvercommit: this.deps.memoryOvercommit },
        recentPlacements,
      )[0];
    }
    if (!node) throw new Error(`no ${snapshot.driver} node can take sandbox ${row.id} from the store`);
    const startedAt = performance.now();
    await ensureSnapshotOn(this.deps, snapshot, node);
    const placement = await nodeAgent(node.nodeId, node.addr).create({
      ...nodeCreateRequest(row, tokens),
      snapshotId: snapshot.id,
      // A memory snapshot's envd already holds the sandbox's token: /init presents it and keeps it.
      ...(snapshot.memory ? { snapshotEnvdAccessToken: tokens.envdToken(row.id, row.tokenNonce) } : {}),
    });
    log.info("paused sandbox resumed from the store on another node", {
      sandboxId: row.id,
      from: row.nodeId,
      to: node.nodeId,
      snapshotId: snapshot.id,
      memory: snapshot.memory,
      ms: Math.round(performance.now() - startedAt),
    });
    return { placement, node };
  }
}
