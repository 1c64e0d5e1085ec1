import { type Db, withTransaction } from "../../store/db.js";
import { appendEvent } from "../../store/events.js";
import { MasterError } from "../errors.js";
import type { SandboxLifecycle } from "../lifecycle.js";
import type { Logger } from "../log.js";
import type { NodeRegistry } from "../node-registry.js";

/** Ledger event type for every sandbox found on a draining node. */
export const NODE_DRAINING_EVENT = "sandbox.node_draining";

/**
 * What happened to a sandbox on a draining node: `paused` (this pass paused it, keeping memory), `already_paused`
 * (it was paused before), `not_paused` (its node could not pause it: the driver does not support it, or the
 * node did not answer; it keeps running until the node goes, and is then recorded lost).
 */
export type DrainOutcome = "paused" | "already_paused" | "not_paused";

export interface DrainReport {
  readonly node: string;
  readonly sandboxId: string;
  readonly outcome: DrainOutcome;
}

/**
 * Pauses the sandboxes of nodes being drained (leader only, once per reconcile pass).
 *
 * "Move" here means: stop the sandbox on the node that is going away *in a state that can be resumed*, and say
 * so in its ledger. It does not mean "run it elsewhere": resume always happens on the node that holds the
 * snapshot (the snapshot is on that node's disk), and resuming on another node is not implemented. A sandbox
 * paused by a drain therefore resumes once its node is back (drain taint removed, agent running again, same
 * node id and data directory); if the node is deleted instead, the reconciler records it lost when the node's
 * heartbeat stops. A sandbox resumed on a draining node (a connect, or auto-resume on traffic) is paused again
 * by the next pass.
 *
 * Each sandbox is tried once per drain (a failed pause writes `sandbox.pause_failed` to the ledger, and retrying
 * every pass would flood it); reports are kept in memory, so a new leader may report a sandbox once more.
 */
export class NodeDrainer {
  /** Sandboxes already handled, by draining node; forgotten when the node stops draining. */
  private readonly handled = new Map<string, Set<string>>();

  constructor(
    private readonly db: Db,
    private readonly registry: NodeRegistry,
    private readonly lifecycle: SandboxLifecycle,
    private readonly log: Logger,
    private readonly concurrency = 4,
  ) {}

  async pass(): Promise<DrainReport[]> {
    const draining = await this.registry.drainingNodes();
    const nodeIds = new Set(draining.map((d) => d.node.nodeId));
    for (const nodeId of this.handled.keys()) {
      if (!nodeIds.has(nodeId)) {
        this.handled.delete(nodeId);
        this.log.info("node no longer draining", { node: nodeId });
      }
    }
    const reports: DrainReport[] = [];
    for (const { node, reason } of draining) {
      reports.push(...(await this.drain(node.nodeId, reason)));
    }
    return reports;
  }

  private async drain(nodeId: string, reason: string): Promise<DrainReport[]> {
    let handled = this.handled.get(nodeId);
    if (!handled) {
      handled = new Set();
      this.handled.set(nodeId, handled);
      this.log.warn("node draining; pausing its sandboxes", { node: nodeId, reason });
    }
    const rows = await this.db.query<{ id: string; team_id: string; state: string }>(
      "SELECT id, team_id, state FROM sandboxes WHERE node_id = $1 AND state IN ('running', 'paused') ORDER BY id",
      [nodeId],
    );
    const reports: DrainReport[] = [];
    const queue = rows.rows.filter((row) => row.state === "running" || !handled.has(row.id));
    const work = async (row: { id: string; team_id: string; state: string }) => {
      const outcome = await this.handle(row, nodeId, reason, handled);
      if (outcome) reports.push({ node: nodeId, sandboxId: row.id, outcome });
    };
    await Promise.all(
      Array.from({ length: Math.min(this.concurrency, queue.length) }, async () => {
        for (let next = queue.shift(); next; next = queue.shift()) await work(next);
      }),
    );
    return reports;
  }

  private async handle(
    row: { id: string; team_id: string; state: string },
    nodeId: string,
    reason: string,
    handled: Set<string>,
  ): Promise<DrainOutcome | undefined> {
    if (row.state === "paused") {
      handled.add(row.id);
      await this.report(row, nodeId, reason, "already_paused");
      return "already_paused";
    }
    // Tried before in this drain and the node could not pause it: leave it running, reported once.
    if (handled.has(row.id) && (await this.lastOutcome(row.id)) === "not_paused") return undefined;
    try {
      await this.lifecycle.pause(row.id, undefined, true);
    } catch (error) {
      // Another transition has the sandbox (a kill, a pause, a resume): the next pass looks again.
      if (error instanceof MasterError && ["busy", "conflict", "not_found"].includes(error.kind)) return undefined;
      handled.add(row.id);
      const message = error instanceof Error ? error.message : String(error);
      this.log.warn("could not pause sandbox on draining node", { sandboxId: row.id, node: nodeId, error: message });
      await this.report(row, nodeId, reason, "not_paused", message);
      return "not_paused";
    }
    handled.add(row.id);
    this.log.info("paused sandbox on draining node", { sandboxId: row.id, node: nodeId, reason });
    await this.report(row, nodeId, reason, "paused");
    return "paused";
  }

  private async lastOutcome(sandboxId: string): Promise<string | undefined> {
    const result = await this.db.query<{ outcome: string }>(
      `SELECT data->>'outcome' AS outcome FROM sandbox_events WHERE sandbox_id = $1 AND type = $2
       ORDER BY id DESC LIMIT 1`,
      [sandboxId, NODE_DRAINING_EVENT],
    );
    return result.rows[0]?.outcome;
  }

  private async report(
    row: { id: string; team_id: string },
    nodeId: string,
    reason: string,
    outcome: DrainOutcome,
    error?: string,
  ): Promise<void> {
    await withTransaction(this.db, (tx) =>
      appendEvent(tx, {
        sandboxId: row.id,
        teamId: row.team_id,
        type: NODE_DRAINING_EVENT,
        data: { node: nodeId, reason, outcome, ...(error ? { error } : {}) },
      }),
    );
  }
}
