import { randomBytes } from "node:crypto";
import { type Db, withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { lockSandbox, type SandboxRow } from "../store/sandboxes.js";
import {
  clearSnapshotDigest,
  expireForkCaptures,
  findSnapshot,
  insertSnapshot,
  liveSnapshotIds,
  markSnapshotDeleted,
  parseSnapshotRef,
  type SnapshotKind,
  type SnapshotRow,
  snapshotRef,
  teamNamespace,
} from "../store/snapshots.js";
import { getTeam, type Team } from "../store/teams.js";
import { MasterError, notFound } from "./errors.js";
import type { SandboxLifecycle, SandboxView } from "./lifecycle.js";
import type { Logger } from "./log.js";
import { type NodeAgentConnector, NodeAgentError } from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";

export interface SnapshotDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly lifecycle: SandboxLifecycle;
  readonly log: Logger;
  /** A store layer no published snapshot lists stays this long after its push (MasterConfig.storeLayerGraceMs). */
  readonly storeLayerGraceMs: number;
}

/** E2B's SnapshotInfo, plus what Warren adds. */
export interface SnapshotView {
  readonly snapshotRef: string;
  readonly names: string[];
  readonly snapshotId: string;
  readonly memory: boolean;
  readonly sizeBytes: number;
}

export interface ForkOutcome {
  readonly sandbox?: SandboxView;
  readonly error?: { readonly code: number; readonly message: string };
}

/** E2B's default lifetime of a fork (SandboxForkRequest.timeout). */
export const FORK_DEFAULT_TIMEOUT_SECONDS = 15;
export const FORK_MAX_COUNT = 20;
/** Longer than any capture takes (the node's Snapshot call times out at 5 minutes). */
const SWEEP_GRACE_MS = 10 * 60_000;

const HTTP_STATUS: Record<string, number> = {
  not_found: 404,
  invalid: 400,
  forbidden: 403,
  quota: 429,
  conflict: 409,
  busy: 409,
  unavailable: 503,
  unimplemented: 501,
};

export function snapshotView(row: SnapshotRow, team: Team): SnapshotView {
  const namespace = teamNamespace(team.name);
  return {
    snapshotRef: snapshotRef(row, namespace),
    names: row.name ? [snapshotRef(row, namespace)] : [],
    snapshotId: row.id,
    memory: row.memory,
    sizeBytes: row.sizeBytes,
  };
}

/**
 * Snapshots and forks. A snapshot is taken by the sandbox's node agent and stays on that node (its files; its
 * memory too where the node's driver keeps it); the row here makes it a template id of the team. The capture
 * runs under the sandbox's row lock, so no pause, resume or kill interleaves, and the row is written only when
 * the node has the snapshot: a failed capture leaves nothing, on either side.
 */
export class SnapshotService {
  constructor(private readonly deps: SnapshotDeps) {}

  /** `memory: false` (E2B's filesystem mode) asks for files only; the microvm driver always keeps memory. */
  async createSnapshot(
    teamId: string,
    sandboxId: string,
    name: string | undefined,
    memory = true,
  ): Promise<SnapshotView> {
    const team = await this.team(teamId, sandboxId);
    const { row, replaced } = await this.capture(team, sandboxId, "snapshot", name, !memory);
    if (replaced) await this.deleteOnNode(replaced);
    return snapshotView(row, team);
  }

  async deleteSnapshot(teamId: string, ref: string): Promise<void> {
    const team = await getTeam(this.deps.db, teamId);
    const parsed = team ? parseSnapshotRef(ref, teamNamespace(team.name)) : undefined;
    const found = parsed && team ? await findSnapshot(this.deps.db, team.id, parsed.idOrName) : undefined;
    const deleted = found ? await markSnapshotDeleted(this.deps.db, found.id) : undefined;
    if (!deleted) throw new MasterError("not_found", `snapshot '${ref}' not found`);
    await this.deleteOnNode(deleted);
  }

  /**
   * E2B fork: one capture of the source (it runs on, same id and endAt), then `count` creates from it on its
   * node, each admitted like any create (quota, rate) and reported on its own. The capture is then deleted: the
   * forks keep what they use (drivers never make an instance depend on its snapshot being kept).
   */
  async fork(
    teamId: string,
    sandboxId: string,
    count: number,
    timeoutSeconds: number,
  ): Promise<{ results: ForkOutcome[]; memory: boolean }> {
    const team = await this.team(teamId, sandboxId);
    const { row: snapshot, source } = await this.capture(team, sandboxId, "fork", undefined);
    try {
      const results = await Promise.all(
        Array.from({ length: count }, () =>
          this.deps.lifecycle
            .create({
              teamId,
              templateId: snapshot.id,
              timeoutSeconds,
              metadata: { ...source.metadata },
              envVars: {},
              autoPause: false,
              autoPauseMemory: true,
              autoResume: false,
              // A fork is a copy of the environment: it gets the source's network policy, never a wider one.
              network: source.network,
              allowInternetAccess: source.allowInternetAccess,
              volumeMounts: [],
              snapshot,
            })
            .then(
              ({ sandbox }): ForkOutcome => ({ sandbox }),
              (error: unknown): ForkOutcome => ({ error: forkError(error) }),
            ),
        ),
      );
      this.deps.log.info("sandbox forked", {
        sandboxId,
        snapshotId: snapshot.id,
        count,
        started: results.filter((r) => r.sandbox).length,
        memory: snapshot.memory,
      });
      return { results, memory: snapshot.memory };
    } finally {
      await markSnapshotDeleted(this.deps.db, snapshot.id);
      await this.deleteOnNode(snapshot);
    }
  }

  private async team(teamId: string, sandboxId: string): Promise<Team> {
    const team = await getTeam(this.deps.db, teamId);
    if (!team) throw notFound(sandboxId);
    return team;
  }

  private async capture(
    team: Team,
    sandboxId: string,
    kind: SnapshotKind,
    name: string | undefined,
    filesOnly = false,
  ): Promise<{ row: SnapshotRow; replaced: SnapshotRow | undefined; source: SandboxRow }> {
    const { db, registry, nodeAgent, log } = this.deps;
    return withTransaction(
      db,
      async (tx) => {
        const source = await lockSandbox(tx, sandboxId);
        if (!source || source.teamId !== team.id || source.state === "killed" || source.state === "failed") {
          throw notFound(sandboxId);
        }
        if (source.state !== "running" && source.state !== "paused") {
          throw new MasterError("busy", `sandbox ${sandboxId} is ${source.state}; retry shortly`);
        }
        const node = (await registry.liveNodes()).find((n) => n.nodeId === source.nodeId);
        if (!node)
          throw new MasterError("unavailable", `the node of sandbox ${sandboxId} is not reachable; retry later`);
        const snapshotId = `${kind === "fork" ? "f" : "s"}${randomBytes(10).toString("hex")}`;
        const startedAt = performance.now();
        let made: Awaited<ReturnType<ReturnType<NodeAgentConnector>["snapshot"]>>;
        try {
          made = await nodeAgent(node.nodeId, node.addr).snapshot(
            sandboxId,
            snapshotId,
            filesOnly ? { filesOnly } : undefined,
          );
        } catch (error) {
          if (error instanceof NodeAgentError && error.kind === "not_found") throw notFound(sandboxId);
          throw new MasterError("unavailable", `snapshot of sandbox ${sandboxId} failed: ${(error as Error).message}`);
        }
        const { row, replaced } = await insertSnapshot(tx, {
          id: snapshotId,
          teamId: team.id,
          name: name ?? null,
          kind,
          sourceSandboxId: sandboxId,
          nodeId: node.nodeId,
          templateId: source.templateId,
          driver: made.driver,
          memory: made.memory,
          sizeBytes: made.sizeBytes,
          cpuCount: source.cpuCount,
          memoryMB: source.memoryMB,
          diskSizeMB: source.diskSizeMB,
          envVars: source.envVars,
          metadata: source.metadata,
        });
        await appendEvent(tx, {
          sandboxId,
          teamId: team.id,
          type: kind === "fork" ? "sandbox.forked" : "sandbox.snapshotted",
          data: { snapshotId, name: name ?? null, memory: made.memory, sizeBytes: made.sizeBytes },
        });
        log.info("sandbox snapshotted", {
          sandboxId,
          snapshotId,
          kind,
          memory: made.memory,
          ms: Math.round(performance.now() - startedAt),
        });
        return { row, replaced, source };
      },
      { lockTimeoutMs: 30_000 },
    );
  }

  /**
   * Leader loop: deletes snapshot files on live nodes that no live row refers to — deleted while their node was
   * down, captured by a create whose row never committed, or a fork's capture its master did not live to delete. A snapshot younger than SWEEP_GRACE_MS may still be
   * waiting for its row (a capture in progress), so it is left for a later pass.
   */
  async sweepNodes(): Promise<void> {
    const { db, registry, nodeAgent, log } = this.deps;
    const expired = await expireForkCaptures(db, SWEEP_GRACE_MS);
    if (expired > 0) log.warn("fork captures left by an interrupted fork expired", { count: expired });
    for (const node of await registry.liveNodes()) {
      const client = nodeAgent(node.nodeId, node.addr);
      const onNode = await client.listSnapshots().catch(() => undefined);
      if (!onNode) continue;
      const live = await liveSnapshotIds(
        db,
        onNode.map((s) => s.snapshotId),
      );
      for (const snapshot of onNode) {
        if (live.has(snapshot.snapshotId) || Date.now() - snapshot.createdAt.getTime() < SWEEP_GRACE_MS) continue;
        log.info("deleting a snapshot no row refers to", { node: node.nodeId, snapshotId: snapshot.snapshotId });
        await client.deleteSnapshot(snapshot.snapshotId).catch(() => undefined);
      }
    }
  }

  /**
   * Leader loop: removes from the cluster's store what no live snapshot row refers to (a deleted template's ready
   * snapshot and layers, layers a rebuild replaced). A row is always written before its snapshot is published, so
   * a published id without a live row is garbage, never a publish in progress. Any live node can do it: every node
   * is configured with the same store. Returns the ids removed.
   */
  async collectStore(): Promise<string[]> {
    const { db, registry, nodeAgent, log } = this.deps;
    const node = (await registry.liveNodes())[0];
    if (!node) return [];
    const client = nodeAgent(node.nodeId, node.addr);
    const published = await client.listPublishedSnapshots().catch((error) => {
      log.warn("listing the store failed", { node: node.nodeId, error: String(error) });
      return [] as string[];
    });
    const live = await liveSnapshotIds(db, published);
    const removed: string[] = [];
    for (const snapshotId of published) {
      if (live.has(snapshotId)) continue;
      try {
        await client.unpublishSnapshot(snapshotId);
        await clearSnapshotDigest(db, snapshotId);
        removed.push(snapshotId);
      } catch (error) {
        log.warn("removing a snapshot from the store failed", { snapshotId, error: String(error) });
      }
    }
    // Layers no published snapshot stacks any more; a publish in progress pushes its layers before its snapshot.
    const layers = await client.collectStoreLayers(this.deps.storeLayerGraceMs).catch((error) => {
      log.warn("removing unused layers from the store failed", { node: node.nodeId, error: String(error) });
      return [] as string[];
    });
    if (removed.length > 0 || layers.length > 0) {
      log.info("store garbage collected", { node: node.nodeId, removed: removed.length, layers: layers.length });
    }
    return removed;
  }

  /** Best effort: a node that is down keeps the files until `sweepNodes` sees it again. */
  private async deleteOnNode(row: SnapshotRow): Promise<void> {
    const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
    if (!node) return;
    await this.deps
      .nodeAgent(node.nodeId, node.addr)
      .deleteSnapshot(row.id)
      .catch((error) =>
        this.deps.log.warn("deleting a snapshot on its node failed", { snapshotId: row.id, error: String(error) }),
      );
  }
}

function forkError(error: unknown): { code: number; message: string } {
  if (error instanceof MasterError) return { code: HTTP_STATUS[error.kind] ?? 500, message: error.message };
  return { code: 500, message: error instanceof Error ? error.message : String(error) };
}
