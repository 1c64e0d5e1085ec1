import type { NodeHeartbeat } from "@warren/proto/redis";
import { reservedMemoryByNode } from "../store/nodes.js";
import { notify } from "../store/notify.js";
import type { SandboxRow } from "../store/sandboxes.js";
import { Durability } from "./durability.js";
import { MasterError } from "./errors.js";
import type { LifecycleDeps } from "./lifecycle-deps.js";
import { NodeAgentError, type SandboxPlacement } from "./node-agent-client.js";
import { type RecentPlacements, rankNodes } from "./placement.js";
import { relocatePaused } from "./relocation.js";
import { setState, transition } from "./sandbox-transition.js";

/** A node call that failed, as the api should see it: "not supported yet" is not "try again". */
function nodeFailure(what: string, error: unknown): MasterError {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof NodeAgentError && error.kind === "unimplemented") {
    return new MasterError("unimplemented", `${what}: not supported by the node yet (${message})`);
  }
  return new MasterError("unavailable", `${what} failed: ${message}`);
}

/**
 * Pause and resume: each a node call between two transitions behind `pausing` / `resuming`, rolled back to the
 * state it left when the node fails. A resume whose node takes no sandboxes now moves the sandbox first.
 */
export class PauseAndResume {
  private readonly durability: Durability;

  constructor(
    private readonly deps: LifecycleDeps,
    private readonly recentPlacements: RecentPlacements,
  ) {
    this.durability = new Durability({ ...deps, memoryOvercommit: deps.config.memoryOvercommit });
  }

  async pause(sandboxId: string, teamId: string | undefined, memory: boolean): Promise<void> {
    const row = await transition(this.deps.db, sandboxId, teamId, async (tx, current) => {
      if (current.state === "paused" || current.state === "pausing") {
        throw new MasterError("conflict", `Sandbox ${sandboxId} is already paused`);
      }
      if (current.state !== "running") throw new MasterError("busy", `sandbox ${sandboxId} is ${current.state}`);
      return setState(tx, current, "pausing", "sandbox.pausing", { memory });
    });
    const { registry, nodeAgent } = this.deps;
    try {
      const node = (await registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
      if (!node) throw new NodeAgentError("unavailable", `node ${row.nodeId} is not heartbeating`);
      await nodeAgent(node.nodeId, node.addr).pause(row.id, memory);
    } catch (error) {
      await transition(this.deps.db, sandboxId, undefined, (tx, current) =>
        setState(tx, current, "running", "sandbox.pause_failed", { error: String(error) }),
      );
      throw nodeFailure(`pausing sandbox ${sandboxId}`, error);
    }
    await transition(this.deps.db, sandboxId, undefined, async (tx, current) => {
      // Durable again only once this pause is in the store (master/durability.ts); the leader's pass is nudged to
      // capture it now (on commit) instead of at its next turn.
      await notify(tx, "durability", sandboxId);
      return setState(
        tx,
        current,
        "paused",
        "sandbox.paused",
        { memory },
        ", paused_at = now(), end_at = now(), durable_snapshot_id = NULL",
      );
    });
  }

  async resume(sandboxId: string, teamId: string, timeout: number, memory: boolean): Promise<SandboxRow> {
    const row = await transition(this.deps.db, sandboxId, teamId, async (tx, current) => {
      if (current.state !== "paused") throw new MasterError("busy", `sandbox ${sandboxId} is ${current.state}`);
      return setState(tx, current, "resuming", "sandbox.resuming", { memory });
    });
    let placement: SandboxPlacement;
    let movedTo: NodeHeartbeat | undefined;
    try {
      const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
      if (node) ({ placement, movedTo } = await this.resumeFrom(row, node, memory));
      else {
        // Its node is gone (or silent): a durable pause resumes from the store on another node.
        const restored = await this.durability.resumeFromStore(row, this.recentPlacements);
        if (!restored) throw new NodeAgentError("unavailable", `node ${row.nodeId} holding the snapshot is down`);
        ({ placement, node: movedTo } = restored);
      }
    } catch (error) {
      await transition(this.deps.db, sandboxId, undefined, (tx, current) =>
        setState(tx, current, "paused", "sandbox.resume_failed", { error: String(error) }),
      );
      throw nodeFailure(`resuming sandbox ${sandboxId}`, error);
    }
    return transition(this.deps.db, sandboxId, undefined, (tx, current) =>
      setState(
        tx,
        current,
        "running",
        "sandbox.resumed",
        { exec: placement.exec, ...(movedTo ? { movedFrom: row.nodeId, node: movedTo.nodeId } : {}) },
        ", exec_id = $3, paused_at = NULL, end_at = now() + make_interval(secs => $4), node_id = $5",
        [placement.exec, timeout, movedTo?.nodeId ?? row.nodeId],
      ),
    );
  }

  /** Resumes on its live node, or moves it first when that node takes no sandboxes now. */
  private async resumeFrom(
    row: SandboxRow,
    node: NodeHeartbeat,
    memory: boolean,
  ): Promise<{ placement: SandboxPlacement; movedTo: NodeHeartbeat | undefined }> {
    let movedTo = await this.relocationTarget(row, node);
    if (movedTo) {
      const keepMemory = memory && (await this.pausedWithMemory(row.id));
      // A failed move leaves the sandbox paused where it was: resuming it there beats not resuming it.
      const moved =
        (await this.moveThroughStore(row, node, movedTo, keepMemory)) ??
        (await relocatePaused(this.deps, row, node, movedTo, keepMemory).catch((error) => {
          this.deps.log.warn("moving a paused sandbox failed; resuming it on its node", {
            sandboxId: row.id,
            error: String(error),
          });
          return undefined;
        }));
      if (moved) return { placement: moved, movedTo };
      movedTo = undefined;
    }
    const placement = await this.deps.nodeAgent(node.nodeId, node.addr).resume({
      sandboxId: row.id,
      teamId: row.teamId,
      envdAccessToken: this.deps.tokens.envdToken(row.id, row.tokenNonce),
      envVars: row.envVars,
      memory,
    });
    return { placement, movedTo };
  }

  /**
   * A durable pause moves the way a pause whose node is gone resumes: the target pulls the published copy from
   * the store (the units and layers it lacks, read as they stream) instead of a fresh snapshot streamed whole from
   * the old node, which then only removes its instance. Undefined when the pause is not durable yet or the store
   * path failed: the node-to-node move follows.
   */
  private async moveThroughStore(
    row: SandboxRow,
    from: NodeHeartbeat,
    to: NodeHeartbeat,
    keepMemory: boolean,
  ): Promise<SandboxPlacement | undefined> {
    const restored = await this.durability
      .resumeFromStore(row, this.recentPlacements, { node: to, memory: keepMemory })
      .catch((error) => {
        this.deps.log.warn("moving a paused sandbox through the store failed; moving it node to node", {
          sandboxId: row.id,
          error: String(error),
        });
        return undefined;
      });
    if (!restored) return undefined;
    // The old instance; if this fails, the reconciler removes it (its row names the new node).
    await this.deps
      .nodeAgent(from.nodeId, from.addr)
      .kill(row.id)
      .catch((error) =>
        this.deps.log.warn("removing a moved sandbox from its old node failed", {
          sandboxId: row.id,
          error: String(error),
        }),
      );
    return restored.placement;
  }

  /**
   * Where a paused sandbox resumes when its node takes no sandboxes now (cordoned, draining): the best placeable
   * node with the same driver (snapshots are driver-specific). Undefined means "on its own node": it is
   * placeable, or no other node fits.
   */
  private async relocationTarget(row: SandboxRow, holder: NodeHeartbeat): Promise<NodeHeartbeat | undefined> {
    const placeable = await this.deps.registry.placeableNodes();
    if (placeable.some((n) => n.nodeId === holder.nodeId)) return undefined;
    const reserved = await reservedMemoryByNode(this.deps.db);
    const sameDriver = placeable.filter((n) => n.driver === holder.driver);
    const target = rankNodes(
      sameDriver,
      reserved,
      { templateId: row.templateId, memoryMB: row.memoryMB },
      { memoryOvercommit: this.deps.config.memoryOvercommit },
      this.recentPlacements,
    )[0];
    if (!target) {
      // Said, because the sandbox then resumes on a node that takes no new sandboxes.
      this.deps.log.warn("no node can take the paused sandbox; resuming it on its node", {
        sandboxId: row.id,
        node: holder.nodeId,
        placeable: placeable.map((n) => n.nodeId),
        sameDriver: sameDriver.map((n) => n.nodeId),
      });
    }
    return target;
  }

  /** Whether the sandbox's last pause kept memory (a filesystem-only pause is never auto-resumed, as in E2B). */
  async pausedWithMemory(sandboxId: string): Promise<boolean> {
    const result = await this.deps.db.query<{ data: { memory?: boolean } }>(
      "SELECT data FROM sandbox_events WHERE sandbox_id = $1 AND type = 'sandbox.paused' ORDER BY id DESC LIMIT 1",
      [sandboxId],
    );
    return result.rows[0]?.data.memory !== false;
  }
}
