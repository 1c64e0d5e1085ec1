import { timingSafeEqual } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import type { Redis } from "ioredis";
import { effectiveEgress } from "../runtime/egress/policy.js";
import { type Db, type DbClient, withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { findTemplate, reservedMemoryByNode } from "../store/nodes.js";
import { getSandbox, lockSandbox, type SandboxRow, type SandboxState, toSandboxRow } from "../store/sandboxes.js";
import { findSnapshot, parseSnapshotRef, type SnapshotRow, teamNamespace } from "../store/snapshots.js";
import { getTeam, type Team } from "../store/teams.js";
import { admitSandbox } from "./admission.js";
import { MasterError, notFound } from "./errors.js";
import type { Logger } from "./log.js";
import {
  type NodeAgentConnector,
  NodeAgentError,
  type SandboxLogLine,
  type SandboxPlacement,
} from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";
import { RecentPlacements, rankNodes } from "./placement.js";
import { nodeCreateRequest, relocatePaused } from "./relocation.js";
import { deleteRoute } from "./routes.js";
import { sha256Hex, type TokenIssuer } from "./tokens.js";

export interface LifecycleConfig {
  /** Base domain handed to clients; empty means "use your own". */
  readonly domain: string;
  readonly placementAttempts: number;
  readonly memoryOvercommit: number;
  /** How long a replayed create waits for the original to finish. */
  readonly replayWaitMs: number;
}

export interface LifecycleDeps {
  readonly db: Db;
  readonly redis: Redis;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly tokens: TokenIssuer;
  readonly log: Logger;
  readonly config: LifecycleConfig;
}

export interface CreateInput {
  readonly teamId: string;
  readonly templateId: string;
  readonly timeoutSeconds: number;
  readonly metadata: Record<string, string>;
  readonly envVars: Record<string, string>;
  readonly autoPause: boolean;
  readonly autoPauseMemory: boolean;
  readonly autoResume: boolean;
  readonly network: Record<string, unknown> | null;
  readonly allowInternetAccess: boolean | null;
  readonly volumeMounts: unknown[];
  readonly idempotencyKey?: string;
  readonly requestHash?: string;
  /** Start from this snapshot (a fork's); otherwise `templateId` may name one of the team's snapshots. */
  readonly snapshot?: SnapshotRow;
}

/** What create/connect hand back to the api. */
export interface SandboxView {
  readonly sandboxId: string;
  readonly templateId: string;
  readonly alias: string;
  readonly envdVersion: string;
  readonly envdAccessToken: string;
  readonly trafficAccessToken: string;
  readonly domain: string;
}

const DEFAULT_TIMEOUT_SECONDS = 300;
/** envd's port: requests to it carry the envd access token (X-Access-Token). */
const ENVD_PORT = 49983;

function sameToken(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** A node call that failed, as the api should see it: "not supported yet" is not "try again". */
function nodeFailure(what: string, error: unknown): MasterError {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof NodeAgentError && error.kind === "unimplemented") {
    return new MasterError("unimplemented", `${what}: not supported by the node yet (${message})`);
  }
  return new MasterError("unavailable", `${what} failed: ${message}`);
}

/**
 * The sandbox state machine. Every change happens in a PostgreSQL transaction that holds the sandbox's row
 * lock and ends by appending to the ledger; long node calls run between two such transactions behind an
 * intermediate state (starting, pausing, resuming) so a second transition sees the first and is refused.
 */
export class SandboxLifecycle {
  private readonly recentPlacements = new RecentPlacements();

  constructor(private readonly deps: LifecycleDeps) {}

  view(row: SandboxRow): SandboxView {
    const { tokens, config } = this.deps;
    return {
      sandboxId: row.id,
      templateId: row.templateId,
      alias: row.alias ?? "",
      envdVersion: row.envdVersion,
      envdAccessToken: tokens.envdToken(row.id, row.tokenNonce),
      trafficAccessToken: row.trafficTokenHash ? tokens.trafficToken(row.id, row.tokenNonce) : "",
      domain: config.domain,
    };
  }

  async create(input: CreateInput): Promise<{ sandbox: SandboxView; replayed: boolean }> {
    const { db } = this.deps;
    const [team, named, allNodes, reserved] = await Promise.all([
      getTeam(db, input.teamId),
      input.snapshot ? undefined : findTemplate(db, input.templateId),
      this.deps.registry.placeableNodes(),
      reservedMemoryByNode(db),
    ]);
    if (!team) throw new MasterError("not_found", `team '${input.teamId}' not found`);
    // A template first; else one of the team's snapshots, which starts only on the node that holds it.
    const snapshot = input.snapshot ?? (named ? undefined : await this.teamSnapshot(team, input.templateId));
    const template = snapshot ? await findTemplate(db, snapshot.templateId) : named;
    if (!template) throw new MasterError("not_found", `template '${input.templateId}' not found`);
    const nodes = snapshot ? allNodes.filter((node) => node.nodeId === snapshot.nodeId) : allNodes;
    if (snapshot && nodes.length === 0) {
      throw new MasterError(
        "unavailable",
        `snapshot '${input.templateId}' is on node ${snapshot.nodeId}, which is not taking sandboxes now; retry later`,
      );
    }
    if (nodes.length > 0 && nodes.every((node) => node.servable && !node.servable.includes(template.id))) {
      const drivers = [...new Set(nodes.map((node) => node.driver))].join(", ");
      throw new MasterError(
        "unavailable",
        `no live node can run template '${input.templateId}': it requires a runtime driver none of them has (${drivers})`,
      );
    }
    const resources = snapshot
      ? { cpuCount: snapshot.cpuCount, memoryMB: snapshot.memoryMB, diskSizeMB: snapshot.diskSizeMB }
      : { cpuCount: template.cpuCount, memoryMB: template.memoryMB, diskSizeMB: template.diskSizeMB };
    const admittedInput = snapshot ? { ...input, envVars: { ...snapshot.envVars, ...input.envVars } } : input;
    const timeout = input.timeoutSeconds > 0 ? input.timeoutSeconds : DEFAULT_TIMEOUT_SECONDS;
    if (timeout > team.maxLengthHours * 3600) {
      throw new MasterError("invalid", `Timeout cannot be greater than ${team.maxLengthHours} hours`);
    }
    const publicTraffic = input.network?.allowPublicTraffic !== false;
    const firstChoice = rankNodes(
      nodes,
      reserved,
      { templateId: template.id, memoryMB: resources.memoryMB },
      this.placementOptions(),
      this.recentPlacements,
    )[0];
    if (snapshot && !firstChoice) {
      throw new MasterError(
        "unavailable",
        `node ${snapshot.nodeId} (holding the snapshot) has no room now; retry later`,
      );
    }
    if (firstChoice) this.recentPlacements.record(firstChoice.nodeId, template.id);
    const admitted = await withTransaction(db, (tx) =>
      admitSandbox(tx, this.deps.tokens, team, admittedInput, {
        templateId: template.id,
        alias: template.alias,
        ...resources,
        envdVersion: template.envdVersion,
        timeout,
        publicTraffic,
        nodeId: firstChoice?.nodeId ?? null,
      }),
    );
    if (admitted.replayed) {
      const row = await this.awaitSettled(admitted.row.id);
      if (row.state === "failed" && row.endReason === "placement_failed") {
        throw new MasterError("unavailable", `the original create with this Idempotency-Key failed; retry`);
      }
      if (row.state === "killed" || row.state === "failed") throw notFound(row.id);
      return { sandbox: this.view(row), replayed: true };
    }
    const row = await this.place(admitted.row, timeout, input.templateId, firstChoice, snapshot);
    return { sandbox: this.view(row), replayed: false };
  }

  private async teamSnapshot(team: Team, ref: string): Promise<SnapshotRow | undefined> {
    const parsed = parseSnapshotRef(ref, teamNamespace(team.name));
    return parsed ? findSnapshot(this.deps.db, team.id, parsed.idOrName) : undefined;
  }

  /** How a sandbox starts from a snapshot on its node; a memory snapshot's envd holds its source's token. */
  private async snapshotStart(
    snapshot: SnapshotRow,
  ): Promise<{ snapshotId: string; snapshotEnvdAccessToken?: string }> {
    if (!snapshot.memory) return { snapshotId: snapshot.id };
    const source = await getSandbox(this.deps.db, snapshot.sourceSandboxId);
    if (!source) throw new MasterError("internal", `the source of snapshot '${snapshot.id}' is not recorded`);
    return {
      snapshotId: snapshot.id,
      snapshotEnvdAccessToken: this.deps.tokens.envdToken(source.id, source.tokenNonce),
    };
  }

  private placementOptions() {
    return { memoryOvercommit: this.deps.config.memoryOvercommit };
  }

  /** Live nodes that can take the sandbox, best first, skipping `exclude`. */
  private async rank(row: SandboxRow, exclude: ReadonlySet<string>) {
    const [nodes, reserved] = await Promise.all([
      this.deps.registry.placeableNodes(),
      reservedMemoryByNode(this.deps.db),
    ]);
    // The row's own reservation sits on a node already tried (excluded), so it does not count against others.
    return rankNodes(
      nodes.filter((node) => !exclude.has(node.nodeId)),
      reserved,
      { templateId: row.templateId, memoryMB: row.memoryMB },
      this.placementOptions(),
      this.recentPlacements,
    );
  }

  /** Tries nodes best first; a node that refuses or fails is skipped for the next one. */
  private async place(
    row: SandboxRow,
    timeout: number,
    templateRef: string,
    firstChoice: NodeHeartbeat | undefined,
    snapshot?: SnapshotRow,
  ): Promise<SandboxRow> {
    const { db, nodeAgent, tokens, log, config } = this.deps;
    const tried = new Set<string>();
    const reasons: string[] = [];
    const fromSnapshot = snapshot ? await this.snapshotStart(snapshot) : {};
    // A snapshot is on one node: no other node can start it.
    const attempts = snapshot ? 1 : config.placementAttempts;
    for (let attempt = 0; attempt < attempts; attempt++) {
      // The admitted row already names the first choice; a retry moves the reservation to the next node.
      const node = attempt === 0 && firstChoice ? firstChoice : (await this.rank(row, tried))[0];
      if (!node) break;
      if (node !== firstChoice) this.recentPlacements.record(node.nodeId, row.templateId);
      tried.add(node.nodeId);
      if (node.nodeId !== row.nodeId || attempt > 0) {
        await db.query("UPDATE sandboxes SET node_id = $2 WHERE id = $1 AND state = 'starting'", [row.id, node.nodeId]);
      }
      let placement: SandboxPlacement;
      try {
        placement = await nodeAgent(node.nodeId, node.addr).create({
          ...nodeCreateRequest(row, tokens),
          ...fromSnapshot,
        });
      } catch (error) {
        const reason = error instanceof Error ? error.message : String(error);
        reasons.push(`${node.nodeId}: ${reason}`);
        log.warn("node refused sandbox", { sandboxId: row.id, node: node.nodeId, reason });
        continue;
      }
      return await this.markStarted(row, node.nodeId, placement, timeout);
    }
    await this.failCreate(row, reasons);
    const detail = reasons.length > 0 ? `: ${reasons.join("; ")}` : "";
    throw new MasterError("unavailable", `no node could start a sandbox from template '${templateRef}'${detail}`);
  }

  private async markStarted(
    row: SandboxRow,
    nodeId: string,
    placement: SandboxPlacement,
    timeout: number,
  ): Promise<SandboxRow> {
    const { db, nodeAgent, registry, log } = this.deps;
    const started = await withTransaction(db, async (tx) => {
      const current = await lockSandbox(tx, row.id);
      if (current?.state !== "starting") return undefined;
      const result = await tx.query(
        `UPDATE sandboxes SET state = 'running', node_id = $2, exec_id = $3, envd_version = COALESCE($4, envd_version),
           end_at = now() + make_interval(secs => $5) WHERE id = $1 RETURNING *`,
        [row.id, nodeId, placement.exec, placement.envdVersion ?? null, timeout],
      );
      await appendEvent(tx, {
        sandboxId: row.id,
        teamId: row.teamId,
        type: "sandbox.started",
        fromState: "starting",
        toState: "running",
        data: { node: nodeId, exec: placement.exec },
      });
      return toSandboxRow(result.rows[0]);
    });
    if (started) return started;
    // Killed while starting: the kill saw no node to call, so the sandbox is ours to remove.
    const node = (await registry.liveNodes()).find((n) => n.nodeId === nodeId);
    if (node)
      await nodeAgent(nodeId, node.addr)
        .kill(row.id)
        .catch(() => undefined);
    log.info("sandbox killed while starting", { sandboxId: row.id, node: nodeId });
    throw notFound(row.id);
  }

  private async failCreate(row: SandboxRow, reasons: string[]): Promise<void> {
    await withTransaction(this.deps.db, async (tx) => {
      const current = await lockSandbox(tx, row.id);
      if (current?.state !== "starting") return;
      await tx.query(
        `UPDATE sandboxes SET state = 'failed', node_id = NULL, idempotency_key = NULL, ended_at = now(),
           end_reason = 'placement_failed' WHERE id = $1`,
        [row.id],
      );
      await appendEvent(tx, {
        sandboxId: row.id,
        teamId: row.teamId,
        type: "sandbox.create_failed",
        fromState: "starting",
        toState: "failed",
        data: { reasons },
      });
    });
  }

  /** Waits for a replayed create's original to leave `starting`. */
  private async awaitSettled(id: string): Promise<SandboxRow> {
    const deadline = Date.now() + this.deps.config.replayWaitMs;
    for (;;) {
      const row = await getSandbox(this.deps.db, id);
      if (!row) throw notFound(id);
      if (row.state !== "starting") return row;
      if (Date.now() > deadline) throw new MasterError("busy", `sandbox ${id} is still starting`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /**
   * Runs one transition under the row lock. `teamId` undefined means the master itself (evictor, reconciler).
   * Returns what `fn` returns; `fn` sees the locked row.
   */
  private async transition<T>(
    sandboxId: string,
    teamId: string | undefined,
    fn: (tx: DbClient, row: SandboxRow) => Promise<T>,
  ): Promise<T> {
    return withTransaction(this.deps.db, async (tx) => {
      await tx.query("SET LOCAL lock_timeout = '30s'");
      const row = await lockSandbox(tx, sandboxId);
      if (!row || (teamId !== undefined && row.teamId !== teamId)) throw notFound(sandboxId);
      if (row.state === "killed" || row.state === "failed") throw notFound(sandboxId);
      return fn(tx, row);
    });
  }

  private async setState(
    tx: DbClient,
    row: SandboxRow,
    to: SandboxState,
    type: string,
    data: Record<string, unknown> = {},
    extraSql = "",
    extraParams: unknown[] = [],
  ): Promise<SandboxRow> {
    const result = await tx.query(`UPDATE sandboxes SET state = $2${extraSql} WHERE id = $1 RETURNING *`, [
      row.id,
      to,
      ...extraParams,
    ]);
    await appendEvent(tx, { sandboxId: row.id, teamId: row.teamId, type, fromState: row.state, toState: to, data });
    return toSandboxRow(result.rows[0]);
  }

  async kill(sandboxId: string, teamId: string | undefined, reason = "killed"): Promise<void> {
    await this.transition(sandboxId, teamId, async (tx, row) => {
      if (row.state === "pausing" || row.state === "resuming") {
        throw new MasterError("busy", `sandbox ${sandboxId} is ${row.state}; retry shortly`);
      }
      if (row.state !== "starting" && row.nodeId) await this.killOnNode(row);
      await this.setState(tx, row, "killed", "sandbox.killed", { reason }, ", ended_at = now(), end_reason = $3", [
        reason,
      ]);
    });
  }

  /** Kills on the node; an unreachable node does not stop the kill (its route is removed here instead). */
  private async killOnNode(row: SandboxRow): Promise<void> {
    const { registry, nodeAgent, redis, log } = this.deps;
    const node = (await registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
    try {
      if (!node) throw new NodeAgentError("unavailable", `node ${row.nodeId} is not heartbeating`);
      await nodeAgent(node.nodeId, node.addr).kill(row.id);
    } catch (error) {
      if (error instanceof NodeAgentError && error.kind === "not_found") return;
      log.warn("kill on node failed; removing the route", { sandboxId: row.id, node: row.nodeId, error });
      if (row.execId) await deleteRoute(redis, row.id, row.execId).catch(() => undefined);
    }
  }

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
    await this.transition(sandboxId, teamId, async (tx, row) => {
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
    return this.transition(sandboxId, teamId, async (tx, row) => {
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

  async connect(
    sandboxId: string,
    teamId: string,
    seconds: number,
    memory: boolean | undefined,
  ): Promise<{ sandbox: SandboxView; resumed: boolean }> {
    const timeout = seconds > 0 ? seconds : DEFAULT_TIMEOUT_SECONDS;
    const row = await this.transition(sandboxId, teamId, async (_tx, current) => current);
    if (row.state === "running" || row.state === "pausing") {
      if (row.state === "running") await this.setTimeout(sandboxId, teamId, timeout, true);
      return { sandbox: this.view(row), resumed: false };
    }
    if (row.state === "paused") {
      const resumed = await this.resume(sandboxId, teamId, timeout, memory ?? true);
      return { sandbox: this.view(resumed), resumed: true };
    }
    if (row.state === "starting") throw notFound(sandboxId);
    throw new MasterError("busy", `sandbox ${sandboxId} is ${row.state}; retry shortly`);
  }

  async pause(sandboxId: string, teamId: string | undefined, memory: boolean): Promise<void> {
    const row = await this.transition(sandboxId, teamId, async (tx, current) => {
      if (current.state === "paused" || current.state === "pausing") {
        throw new MasterError("conflict", `Sandbox ${sandboxId} is already paused`);
      }
      if (current.state !== "running") throw new MasterError("busy", `sandbox ${sandboxId} is ${current.state}`);
      return this.setState(tx, current, "pausing", "sandbox.pausing", { memory });
    });
    const { registry, nodeAgent } = this.deps;
    try {
      const node = (await registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
      if (!node) throw new NodeAgentError("unavailable", `node ${row.nodeId} is not heartbeating`);
      await nodeAgent(node.nodeId, node.addr).pause(row.id, memory);
    } catch (error) {
      await this.transition(sandboxId, undefined, (tx, current) =>
        this.setState(tx, current, "running", "sandbox.pause_failed", { error: String(error) }),
      );
      throw nodeFailure(`pausing sandbox ${sandboxId}`, error);
    }
    await this.transition(sandboxId, undefined, (tx, current) =>
      this.setState(tx, current, "paused", "sandbox.paused", { memory }, ", paused_at = now(), end_at = now()"),
    );
  }

  private async resume(sandboxId: string, teamId: string, timeout: number, memory: boolean): Promise<SandboxRow> {
    const row = await this.transition(sandboxId, teamId, async (tx, current) => {
      if (current.state !== "paused") throw new MasterError("busy", `sandbox ${sandboxId} is ${current.state}`);
      return this.setState(tx, current, "resuming", "sandbox.resuming", { memory });
    });
    const { registry, nodeAgent, tokens } = this.deps;
    let placement: SandboxPlacement | undefined;
    let movedTo: NodeHeartbeat | undefined;
    try {
      const node = (await registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
      if (!node) throw new NodeAgentError("unavailable", `node ${row.nodeId} holding the snapshot is down`);
      movedTo = await this.relocationTarget(row, node);
      if (movedTo) {
        const keepMemory = memory && (await this.pausedWithMemory(row.id));
        // A failed move leaves the sandbox paused where it was: resuming it there beats not resuming it.
        placement = await relocatePaused(this.deps, row, node, movedTo, keepMemory).catch((error) => {
          this.deps.log.warn("moving a paused sandbox failed; resuming it on its node", {
            sandboxId: row.id,
            error: String(error),
          });
          movedTo = undefined;
          return undefined;
        });
      }
      placement ??= await nodeAgent(node.nodeId, node.addr).resume({
        sandboxId: row.id,
        teamId: row.teamId,
        envdAccessToken: tokens.envdToken(row.id, row.tokenNonce),
        envVars: row.envVars,
        memory,
      });
    } catch (error) {
      await this.transition(sandboxId, undefined, (tx, current) =>
        this.setState(tx, current, "paused", "sandbox.resume_failed", { error: String(error) }),
      );
      throw nodeFailure(`resuming sandbox ${sandboxId}`, error);
    }
    return this.transition(sandboxId, undefined, (tx, current) =>
      this.setState(
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
      this.placementOptions(),
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

  /**
   * Auto-resume on traffic (the proxy, through the api): E2B's rules (`proxy_grpc.go`). Only a sandbox created
   * with autoResume whose last pause kept memory; the request's tokens must match (envd port: the envd access
   * token; other ports of a private sandbox: the traffic token); a transition in progress is waited for. Many
   * concurrent callers share one resume (per master process; across replicas the row lock and the `paused`
   * check make every other caller wait for, not repeat, the resume).
   */
  async resumeOnTraffic(request: {
    sandboxId: string;
    port: number;
    trafficAccessToken: string;
    envdAccessToken: string;
  }): Promise<{ resumed: boolean }> {
    const { db, tokens } = this.deps;
    const { sandboxId } = request;
    const row = await getSandbox(db, sandboxId);
    if (!row || !row.autoResume || row.state === "killed" || row.state === "failed" || row.state === "starting") {
      throw notFound(sandboxId);
    }
    if (request.port === ENVD_PORT) {
      if (!sameToken(request.envdAccessToken, tokens.envdToken(row.id, row.tokenNonce))) {
        throw new MasterError("forbidden", `invalid X-Access-Token for sandbox ${sandboxId}`);
      }
    } else if (row.trafficTokenHash !== null && sha256Hex(request.trafficAccessToken) !== row.trafficTokenHash) {
      throw new MasterError("forbidden", `invalid traffic access token for sandbox ${sandboxId}`);
    }
    let shared = this.trafficResumes.get(sandboxId);
    if (!shared) {
      shared = this.resumeWhenSettled(row).finally(() => this.trafficResumes.delete(sandboxId));
      this.trafficResumes.set(sandboxId, shared);
    }
    return shared;
  }

  private readonly trafficResumes = new Map<string, Promise<{ resumed: boolean }>>();

  private async resumeWhenSettled(first: SandboxRow): Promise<{ resumed: boolean }> {
    const deadline = Date.now() + this.deps.config.replayWaitMs;
    let row: SandboxRow | undefined = first;
    for (;;) {
      if (!row || row.state === "killed" || row.state === "failed") throw notFound(first.id);
      if (row.state === "running") return { resumed: false };
      if (row.state === "paused") {
        if (!(await this.pausedWithMemory(row.id))) throw notFound(row.id);
        try {
          await this.resume(row.id, row.teamId, DEFAULT_TIMEOUT_SECONDS, true);
          return { resumed: true };
        } catch (error) {
          // Another resume (an explicit connect) took the row first: wait for it like for any transition.
          if (!(error instanceof MasterError && error.kind === "busy")) throw error;
        }
      }
      if (Date.now() > deadline) throw new MasterError("busy", `sandbox ${first.id} is still ${row.state}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
      row = await getSandbox(this.deps.db, first.id);
    }
  }

  /** Whether the sandbox's last pause kept memory (a filesystem-only pause is never auto-resumed, as in E2B). */
  private async pausedWithMemory(sandboxId: string): Promise<boolean> {
    const result = await this.deps.db.query<{ data: { memory?: boolean } }>(
      "SELECT data FROM sandbox_events WHERE sandbox_id = $1 AND type = 'sandbox.paused' ORDER BY id DESC LIMIT 1",
      [sandboxId],
    );
    return result.rows[0]?.data.memory !== false;
  }

  /** The reconciler's verdict: the sandbox is gone (node lost it or went down); its route is removed. */
  async markLost(sandboxId: string, reason: string, data: Record<string, unknown>): Promise<boolean> {
    try {
      const row = await this.transition(sandboxId, undefined, async (tx, current) =>
        this.setState(
          tx,
          current,
          "failed",
          "sandbox.lost",
          { reason, ...data },
          ", ended_at = now(), end_reason = $3",
          [reason],
        ),
      );
      if (row.execId) await deleteRoute(this.deps.redis, row.id, row.execId).catch(() => undefined);
      return true;
    } catch (error) {
      if (error instanceof MasterError && error.kind === "not_found") return false;
      throw error;
    }
  }
}
