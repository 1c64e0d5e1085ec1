import { type Db, withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { listNodes, markNodeDown, markNodeUp } from "../store/nodes.js";
import { getSandbox } from "../store/sandboxes.js";
import type { SandboxLifecycle } from "./lifecycle.js";
import type { Logger } from "./log.js";
import type { NodeAgentConnector } from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";

export interface ReconcileReport {
  readonly nodesDown: string[];
  readonly lost: string[];
  readonly orphansKilled: string[];
  /** Sandboxes a node runs that this cluster has no record of (left alone). */
  readonly unknown: string[];
  /** Paused sandboxes on a node that went down, kept paused: their pause is in the store. */
  readonly keptDurable: string[];
}

/** A lost sandbox's last durable snapshot, made a team snapshot (listed, createable); its id when published. */
async function offerDurableSnapshot(db: Db, snapshotId: string): Promise<string | undefined> {
  const result = await db.query<{ id: string }>(
    "UPDATE snapshots SET kind = 'snapshot' WHERE id = $1 AND kind = 'durable' AND digest IS NOT NULL RETURNING id",
    [snapshotId],
  );
  return result.rows[0]?.id;
}

/**
 * Brings PostgreSQL in line with what nodes report:
 *  - a node whose heartbeat expired is marked down and each of its sandboxes is recorded as lost (ledger
 *    event `sandbox.lost`, reason `node_down`), not silently forgotten;
 *  - a sandbox PostgreSQL has as running/paused on a live node that the node no longer lists is lost too
 *    (reason `missing_on_node`) and its route removed;
 *  - a sandbox a node runs that PostgreSQL has as ended is killed on the node; one PostgreSQL never had is
 *    left alone (it is not this cluster's).
 */
export interface ReconcileTiming {
  /** A sandbox still `starting` after this is failed. */
  readonly startTimeoutMs: number;
  /**
   * A node is down only once its heartbeat has been missing this long: a Redis restart empties the heartbeat
   * keys until each agent's next beat, and that must not fail every sandbox in the cluster.
   */
  readonly nodeDownAfterMs: number;
}

export async function reconcile(
  db: Db,
  registry: NodeRegistry,
  nodeAgent: NodeAgentConnector,
  lifecycle: SandboxLifecycle,
  log: Logger,
  timing: ReconcileTiming = { startTimeoutMs: 120_000, nodeDownAfterMs: 30_000 },
): Promise<ReconcileReport> {
  const { startTimeoutMs, nodeDownAfterMs } = timing;
  const report: ReconcileReport = { nodesDown: [], lost: [], orphansKilled: [], unknown: [], keptDurable: [] };
  // A create whose master died (or whose commit PostgreSQL lost) would stay `starting` forever.
  const stuck = await db.query<{ id: string }>(
    "SELECT id FROM sandboxes WHERE state = 'starting' AND created_at < now() - make_interval(secs => $1)",
    [startTimeoutMs / 1000],
  );
  for (const { id } of stuck.rows) {
    if (await lifecycle.markLost(id, "start_timeout", {})) {
      report.lost.push(id);
      log.warn("sandbox stuck starting; marked failed", { sandboxId: id });
    }
  }
  const live = await registry.liveNodes();
  const liveIds = new Set(live.map((node) => node.nodeId));
  const now = new Date();
  for (const node of live) {
    if (await markNodeUp(db, node.nodeId, node.addr, now)) log.info("node up", { node: node.nodeId, addr: node.addr });
  }
  for (const known of await listNodes(db)) {
    if (known.state !== "up" || liveIds.has(known.id)) continue;
    if (now.getTime() - known.lastSeenAt.getTime() < nodeDownAfterMs) continue;
    if (!(await markNodeDown(db, known.id))) continue;
    report.nodesDown.push(known.id);
    log.warn("node stopped heartbeating; marking it down", { node: known.id });
    // A paused sandbox whose pause is in the store stays paused: a resume starts it on another node. Any other
    // is lost; a running one's last durable snapshot becomes a team snapshot it can be recreated from.
    const onNode = await db.query<{ id: string; state: string; durable: string | null; published: boolean }>(
      `SELECT x.id, x.state, s.id AS durable, (s.digest IS NOT NULL AND s.created_at >= x.paused_at) AS published
       FROM sandboxes x LEFT JOIN snapshots s ON s.id = x.durable_snapshot_id AND s.deleted_at IS NULL
       WHERE x.node_id = $1 AND x.state IN ('running','pausing','paused','resuming')`,
      [known.id],
    );
    for (const { id, state, durable, published } of onNode.rows) {
      // (`resuming`: a resume from the store may be starting it elsewhere right now; it settles the row itself.)
      if ((state === "paused" || state === "resuming") && published) {
        report.keptDurable.push(id);
        log.info("paused sandbox outlives its node (durable in the store)", { sandboxId: id, node: known.id });
        continue;
      }
      const offered = state === "running" && durable ? await offerDurableSnapshot(db, durable) : undefined;
      if (await lifecycle.markLost(id, "node_down", { node: known.id, ...(offered ? { snapshotId: offered } : {}) })) {
        report.lost.push(id);
        log.warn("sandbox lost with its node", { sandboxId: id, node: known.id, snapshotId: offered });
      }
    }
  }
  for (const node of live) {
    // Read PostgreSQL before asking the node: a sandbox recorded running here was started on the node before.
    const expected = await db.query<{ id: string; team_id: string; durable: boolean }>(
      `SELECT x.id, x.team_id, (x.state = 'paused' AND x.durable_snapshot_id IS NOT NULL) AS durable
       FROM sandboxes x WHERE x.node_id = $1 AND x.state IN ('running','paused')`,
      [node.nodeId],
    );
    let onNode: Awaited<ReturnType<ReturnType<NodeAgentConnector>["list"]>>;
    try {
      onNode = await nodeAgent(node.nodeId, node.addr).list();
    } catch (error) {
      log.warn("listing sandboxes on node failed", { node: node.nodeId, error });
      continue;
    }
    const present = new Set(onNode.map((sandbox) => sandbox.sandboxId));
    for (const { id, durable } of expected.rows) {
      if (present.has(id)) continue;
      if (durable) {
        // The node lost its copy (restarted without its state, or stopping), the store has the pause: it stays
        // paused on no node, and a resume starts it from the store.
        const freed = await db.query(
          "UPDATE sandboxes SET node_id = NULL WHERE id = $1 AND node_id = $2 AND state = 'paused'",
          [id, node.nodeId],
        );
        if ((freed.rowCount ?? 0) > 0) {
          report.keptDurable.push(id);
          log.warn("paused sandbox missing on its node; it resumes from the store", {
            sandboxId: id,
            node: node.nodeId,
          });
        }
        continue;
      }
      // The agent's watchdog says why when it removed a dead sandbox (its envd died); else it simply is not there.
      const crash = await registry.crashReason(id).catch(() => undefined);
      const reason = crash ? "crashed" : "missing_on_node";
      if (await lifecycle.markLost(id, reason, { node: node.nodeId, ...(crash ? { detail: crash } : {}) })) {
        report.lost.push(id);
        log.warn("sandbox missing on its node; marked lost", { sandboxId: id, node: node.nodeId, reason, crash });
      }
    }
    for (const sandbox of onNode) {
      const row = await getSandbox(db, sandbox.sandboxId);
      // Rows are written before a node is asked to create, so a sandbox without a row was not made by this
      // cluster (another Warren sharing the Redis, or a node agent's own tests): report it, never destroy it.
      if (!row) {
        report.unknown.push(sandbox.sandboxId);
        continue;
      }
      // A row in transition may be moving to this node (a paused sandbox resuming elsewhere: the new instance exists
      // before the row names its node), so only a settled row on another node makes this copy an orphan.
      const settled = row.state !== "starting" && row.state !== "resuming" && row.state !== "pausing";
      const ended = row.state === "killed" || row.state === "failed" || (settled && row.nodeId !== node.nodeId);
      if (!ended) continue;
      try {
        await nodeAgent(node.nodeId, node.addr).kill(sandbox.sandboxId);
        report.orphansKilled.push(sandbox.sandboxId);
        await withTransaction(db, (tx) =>
          appendEvent(tx, {
            sandboxId: row.id,
            teamId: row.teamId,
            type: "sandbox.orphan_killed",
            data: { node: node.nodeId },
          }),
        );
        log.info("killed orphan sandbox", { sandboxId: sandbox.sandboxId, node: node.nodeId });
      } catch (error) {
        log.warn("killing orphan sandbox failed", { sandboxId: sandbox.sandboxId, node: node.nodeId, error });
      }
    }
  }
  return report;
}
