import type { NodeHeartbeat } from "@warren/proto/redis";
import type { SandboxRow } from "../store/sandboxes.js";
import { deleteDroppedSnapshotFiles, markDurableSnapshotsDropped } from "./durability.js";
import { MasterError } from "./errors.js";
import type { LifecycleDeps } from "./lifecycle-deps.js";
import { NodeAgentError } from "./node-agent-client.js";
import { deleteRoute } from "./routes.js";
import { setState, transition } from "./sandbox-transition.js";

/**
 * How a sandbox ends: killed (by its team, the evictor at its end time, or the master) or recorded lost (the
 * reconciler's verdict). Either way its route stops answering.
 */
export class SandboxTermination {
  constructor(private readonly deps: LifecycleDeps) {}

  async kill(sandboxId: string, teamId: string | undefined, reason = "killed"): Promise<void> {
    // Which node holds it is read while the row's lock is taken (one Redis round trip off a kill's answer).
    const liveNodes = this.deps.registry.liveNodes();
    liveNodes.catch(() => undefined);
    const dropped = await transition(this.deps.db, sandboxId, teamId, async (tx, row) => {
      if (row.state === "pausing" || row.state === "resuming") {
        throw new MasterError("busy", `sandbox ${sandboxId} is ${row.state}; retry shortly`);
      }
      // The row's update and its durable snapshots' go out while the node kills (all commit, or roll back, with
      // the transaction): a kill's answer waits for the slower of them instead of their sum.
      const [, , snapshots] = await Promise.all([
        row.state !== "starting" && row.nodeId ? this.killOnNode(row, liveNodes) : undefined,
        setState(tx, row, "killed", "sandbox.killed", { reason }, ", ended_at = now(), end_reason = $3", [reason]),
        markDurableSnapshotsDropped(tx, sandboxId),
      ]);
      return snapshots;
    });
    await deleteDroppedSnapshotFiles(this.deps, dropped);
  }

  /** Kills on the node; an unreachable node does not stop the kill (its route is removed here instead). */
  private async killOnNode(row: SandboxRow, liveNodes: Promise<NodeHeartbeat[]>): Promise<void> {
    const { nodeAgent, redis, log } = this.deps;
    const node = (await liveNodes).find((n) => n.nodeId === row.nodeId);
    try {
      if (!node) throw new NodeAgentError("unavailable", `node ${row.nodeId} is not heartbeating`);
      await nodeAgent(node.nodeId, node.addr).kill(row.id);
    } catch (error) {
      if (error instanceof NodeAgentError && error.kind === "not_found") return;
      log.warn("kill on node failed; removing the route", { sandboxId: row.id, node: row.nodeId, error });
      if (row.execId) await deleteRoute(redis, row.id, row.execId).catch(() => undefined);
    }
  }

  /** The reconciler's verdict: the sandbox is gone (node lost it or went down); its route is removed. */
  async markLost(sandboxId: string, reason: string, data: Record<string, unknown>): Promise<boolean> {
    try {
      const row = await transition(this.deps.db, sandboxId, undefined, async (tx, current) =>
        setState(tx, current, "failed", "sandbox.lost", { reason, ...data }, ", ended_at = now(), end_reason = $3", [
          reason,
        ]),
      );
      if (row.execId) await deleteRoute(this.deps.redis, row.id, row.execId).catch(() => undefined);
      return true;
    } catch (error) {
      if (error instanceof MasterError && error.kind === "not_found") return false;
      throw error;
    }
  }
}
