import { effectiveEgress } from "../runtime/egress/policy.js";
import { appendEvent } from "../store/events.js";
import { getSandbox } from "../store/sandboxes.js";
import { getTeam } from "../store/teams.js";
import { MasterError, notFound } from "./errors.js";
import type { LifecycleDeps } from "./lifecycle-deps.js";
import { NodeAgentError, type SandboxLogLine } from "./node-agent-client.js";
import { transition } from "./sandbox-transition.js";

/**
 * A live sandbox's settings and its node's log lines: what is read or changed without moving it to another
 * state (its end time and egress policy change under the row lock, and land in the ledger).
 */
export class SandboxSettings {
  constructor(private readonly deps: LifecycleDeps) {}

  /**
   * The sandbox's own log lines from its node (envd); empty when it is on no live node (killed, failed, node
   * down) or the node no longer has it. Lifecycle events come from the ledger, not from here.
   */
  async logs(sandboxId: string, teamId: string, limit: number): Promise<SandboxLogLine[]> {
    const row = await getSandbox(this.deps.db, sandboxId);
    if (!row || row.teamId !== teamId) throw notFound(sandboxId);
    if ((row.state !== "running" && row.state !== "paused") || !row.nodeId) return [];
    const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
    if (!node) return [];
    try {
      return await this.deps.nodeAgent(node.nodeId, node.addr).logs(sandboxId, limit);
    } catch (error) {
      if (error instanceof NodeAgentError) return [];
      throw error;
    }
  }

  /**
   * Replaces a sandbox's egress policy (E2B `PUT /sandboxes/{id}/network`: allowOut, denyOut and
   * allow_internet_access, omitted fields cleared; allowPublicTraffic and maskRequestHost are create-time only and
   * kept). The node applies it first; the row changes only when the node did, so the two never disagree.
   */
  async updateNetwork(
    sandboxId: string,
    teamId: string,
    network: Record<string, unknown>,
    allowInternetAccess: boolean | null,
  ): Promise<void> {
    const team = await getTeam(this.deps.db, teamId);
    if (!team) throw notFound(sandboxId);
    await transition(this.deps.db, sandboxId, teamId, async (tx, row) => {
      if (row.state === "starting" || row.state === "pausing" || row.state === "resuming") {
        throw new MasterError("busy", `sandbox ${sandboxId} is ${row.state}; retry shortly`);
      }
      if (row.state !== "running" && row.state !== "paused") throw notFound(sandboxId);
      const egress = effectiveEgress(network, allowInternetAccess, team.egressMode);
      const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
      if (!node) throw new MasterError("unavailable", `the node of sandbox ${sandboxId} is not reachable; retry later`);
      await this.deps.nodeAgent(node.nodeId, node.addr).updateEgress(row.id, egress);
      const kept = Object.fromEntries(
        Object.entries(row.network ?? {}).filter(([key]) => key === "allowPublicTraffic" || key === "maskRequestHost"),
      );
      const stored = { ...kept, ...network };
      await tx.query("UPDATE sandboxes SET network = $2, allow_internet_access = $3, egress = $4 WHERE id = $1", [
        row.id,
        JSON.stringify(stored),
        allowInternetAccess,
        JSON.stringify(egress),
      ]);
      await appendEvent(tx, {
        sandboxId: row.id,
        teamId: row.teamId,
        type: "sandbox.network_changed",
        data: { allowOut: egress.allowOut, denyOut: egress.denyOut },
      });
    });
  }

  async setTimeout(sandboxId: string, teamId: string, seconds: number, extendOnly: boolean): Promise<{ endAt: Date }> {
    const team = await getTeam(this.deps.db, teamId);
    if (!team) throw notFound(sandboxId);
    return transition(this.deps.db, sandboxId, teamId, async (tx, row) => {
      if (row.state === "starting") throw notFound(sandboxId);
      if (row.state !== "running") throw new MasterError("conflict", `sandbox ${sandboxId} is ${row.state}`);
      const now = Date.now();
      const max = row.startedAt.getTime() + team.maxLengthHours * 3600_000;
      if (now >= max) throw new MasterError("invalid", "Max instance length exceeded");
      const wanted = Math.min(now + seconds * 1000, max);
      if (extendOnly && wanted <= row.endAt.getTime()) return { endAt: row.endAt };
      const endAt = new Date(wanted);
      await tx.query("UPDATE sandboxes SET end_at = $2 WHERE id = $1", [row.id, endAt]);
      await appendEvent(tx, {
        sandboxId: row.id,
        teamId: row.teamId,
        type: "sandbox.timeout_changed",
        data: { endAt: endAt.toISOString(), previousEndAt: row.endAt.toISOString() },
      });
      return { endAt };
    });
  }
}
