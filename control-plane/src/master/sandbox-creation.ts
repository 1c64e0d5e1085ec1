import type { NodeHeartbeat } from "@warren/proto/redis";
import { withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { findTemplate, reservedMemoryByNode } from "../store/nodes.js";
import { getSandbox, lockSandbox, markSandboxRunning, type SandboxRow } from "../store/sandboxes.js";
import {
  findSnapshot,
  getLiveSnapshot,
  parseSnapshotRef,
  type SnapshotRow,
  snapshotHolders,
  teamNamespace,
} from "../store/snapshots.js";
import { getTeam, type Team } from "../store/teams.js";
import { findTemplateByRef, parseTemplateName, readyBuildOf } from "../store/template-refs.js";
import { hasPendingBuild } from "../store/template-tags.js";
import { type BuildRecord, recordSpawn, type TemplateRecord } from "../store/templates.js";
import { admitSandbox } from "./admission.js";
import { MasterError, notFound } from "./errors.js";
import { DEFAULT_TIMEOUT_SECONDS, type LifecycleDeps } from "./lifecycle-deps.js";
import { isStillPreparing, type NodeAgentClient, type SandboxPlacement } from "./node-agent-client.js";
import { type RecentPlacements, rankNodes } from "./placement.js";
import { nodeCreateRequest } from "./relocation.js";
import { ensureSnapshotOn, holdersFirst } from "./snapshot-copies.js";
import { startAndAwaitReady } from "./templates/start-ready.js";

/** How often a create waiting for a node to finish building a template asks again. */
const TEMPLATE_WAIT_POLL_MS = 1_000;

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
  /** E2B's `mcp` server names, kept on the row (the SDK starts the gateway itself). */
  readonly mcpServers?: readonly string[];
  readonly idempotencyKey?: string;
  readonly requestHash?: string;
  /** Start from this snapshot (a fork's); otherwise `templateId` may name one of the team's snapshots. */
  readonly snapshot?: SnapshotRow;
}

/**
 * A create, from the request to a running sandbox: resolves the template (or the team's snapshot), admits the
 * `starting` row, then tries nodes best first until one starts it. A replayed create (same Idempotency-Key)
 * waits for its original instead.
 */
export class SandboxCreation {
  constructor(
    private readonly deps: LifecycleDeps,
    private readonly recentPlacements: RecentPlacements,
  ) {}

  async create(input: CreateInput): Promise<{ row: SandboxRow; replayed: boolean }> {
    const { db } = this.deps;
    const teamLookup = getTeam(db, input.teamId);
    // A template (the team's own, then Warren's), else one of the team's snapshots, which starts only on the node
    // that holds it. A team template's build starts from its ready snapshot, on that node.
    // Every lookup at once, the team's too: a name is usually one of Warren's templates, which the custom lookup
    // passes over, and only a `team/name` ref needs the team's name (one round of queries on a create, not two).
    const templateLookups = input.snapshot
      ? Promise.resolve([undefined, undefined] as const)
      : Promise.all([
          this.customTemplate(input.teamId, teamLookup, input.templateId),
          findTemplate(db, input.templateId),
        ]);
    // Its failure is reported below, after the team's: never unhandled meanwhile.
    templateLookups.catch(() => undefined);
    const [team, allNodes, reserved] = await Promise.all([
      teamLookup,
      this.deps.registry.placeableNodes(),
      reservedMemoryByNode(db),
    ]);
    if (!team) throw new MasterError("not_found", `team '${input.teamId}' not found`);
    const [custom, shipped] = await templateLookups;
    const named = input.snapshot || custom ? undefined : shipped;
    const snapshot =
      input.snapshot ??
      custom?.snapshot ??
      (named || custom ? undefined : await this.teamSnapshot(team, input.templateId));
    const template = custom
      ? // The node template under a team template (`base`, or `scratch` under an image) is not itself offered.
        {
          id: custom.build.baseTemplateId ?? "",
          alias: null,
          cpuCount: custom.build.cpuCount,
          memoryMB: custom.build.memoryMB,
          diskSizeMB: custom.build.diskSizeMB,
          envdVersion: custom.build.envdVersion,
        }
      : snapshot
        ? await findTemplate(db, snapshot.templateId)
        : named;
    if (!template) throw new MasterError("not_found", `template '${input.templateId}' not found`);
    // A snapshot starts where it is; a published one (a built template) on any node of its driver, which pulls it.
    const holders = snapshot ? await snapshotHolders(db, snapshot) : undefined;
    const eligible = (node: NodeHeartbeat) =>
      !snapshot || holders?.has(node.nodeId) === true || (snapshot.digest !== null && node.driver === snapshot.driver);
    const nodes = allNodes.filter(eligible);
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
    const firstChoice = holdersFirst(
      rankNodes(
        nodes,
        reserved,
        { templateId: template.id, memoryMB: resources.memoryMB },
        this.placementOptions(),
        this.recentPlacements,
      ),
      holders,
    )[0];
    if (snapshot && !firstChoice) {
      throw new MasterError(
        "unavailable",
        `node ${snapshot.nodeId} (holding the snapshot) has no room now; retry later`,
      );
    }
    if (firstChoice) this.recentPlacements.record(firstChoice.nodeId, template.id);
    const admitted = await admitSandbox(db, this.deps.tokens, team, admittedInput, {
      templateId: template.id,
      alias: custom ? custom.template.alias : template.alias,
      ...(custom ? { sourceTemplateId: custom.template.id, buildId: custom.build.id } : {}),
      ...resources,
      envdVersion: template.envdVersion,
      timeout,
      publicTraffic,
      nodeId: firstChoice?.nodeId ?? null,
    });
    if (admitted.replayed) {
      const row = await this.awaitSettled(admitted.row.id);
      if (row.state === "failed" && row.endReason === "placement_failed") {
        throw new MasterError("unavailable", `the original create with this Idempotency-Key failed; retry`);
      }
      if (row.state === "killed" || row.state === "failed") throw notFound(row.id);
      return { row, replayed: true };
    }
    const row = await this.place(admitted.row, timeout, input.templateId, firstChoice, snapshot, custom?.build, {
      eligible,
      holders,
    });
    if (custom) await recordSpawn(db, custom.template.id).catch(() => undefined);
    return { row, replayed: false };
  }

  /**
   * A team's (or a public) custom template and the ready build its tag names. A name that resolves to a template
   * without a ready build under that tag is a 404 naming the tag, as E2B answers.
   */
  private async customTemplate(
    teamId: string,
    team: Promise<Team | undefined>,
    ref: string,
  ): Promise<{ template: TemplateRecord; build: BuildRecord; snapshot?: SnapshotRow } | undefined> {
    const { db } = this.deps;
    // The team's name is its namespace, which only a `team/name:tag` ref names: other refs do not wait for it.
    const namespace = refNamesNamespace(ref) ? teamNamespace((await team)?.name ?? "") : "";
    const resolved = await findTemplateByRef(db, { id: teamId, namespace }, ref);
    if (!resolved || resolved.template.teamId === null) return undefined;
    let build = await readyBuildOf(db, resolved);
    // The template's build is still running (a new template): wait for it within the create's deadline.
    const waitUntil = Date.now() + this.deps.config.templateWaitMs;
    while (!build && Date.now() < waitUntil && (await hasPendingBuild(db, resolved.template.id, resolved.tag))) {
      await new Promise((resolve) => setTimeout(resolve, TEMPLATE_WAIT_POLL_MS));
      build = await readyBuildOf(db, resolved);
    }
    if (!build) {
      throw new MasterError(
        "not_found",
        `tag '${resolved.tag}' does not exist for template '${resolved.template.alias ?? resolved.template.id}' (no ready build)`,
      );
    }
    if (!build.snapshotId) return { template: resolved.template, build };
    const snapshot = await getLiveSnapshot(db, build.snapshotId);
    if (!snapshot) throw new MasterError("unavailable", `the build of template '${ref}' is no longer on any node`);
    return { template: resolved.template, build, snapshot };
  }

  private async teamSnapshot(team: Team, ref: string): Promise<SnapshotRow | undefined> {
    const parsed = parseSnapshotRef(ref, teamNamespace(team.name));
    return parsed ? findSnapshot(this.deps.db, team.id, parsed.idOrName) : undefined;
  }

  /** How a sandbox starts from a snapshot on its node; a memory snapshot's envd holds its source's token. */
  private async snapshotStart(
    snapshot: SnapshotRow,
    build?: BuildRecord,
  ): Promise<{ snapshotId: string; snapshotEnvdAccessToken?: string }> {
    if (!snapshot.memory) return { snapshotId: snapshot.id };
    if (build?.buildSandboxId && build.tokenNonce) {
      // A template's ready snapshot: its envd holds the build sandbox's token.
      return {
        snapshotId: snapshot.id,
        snapshotEnvdAccessToken: this.deps.tokens.envdToken(build.buildSandboxId, build.tokenNonce),
      };
    }
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

  /** Live nodes that can take the sandbox, best first (holders of its snapshot first), skipping `exclude`. */
  private async rank(
    row: SandboxRow,
    exclude: ReadonlySet<string>,
    eligible: (node: NodeHeartbeat) => boolean = () => true,
    holders?: ReadonlySet<string>,
  ) {
    const [nodes, reserved] = await Promise.all([
      this.deps.registry.placeableNodes(),
      reservedMemoryByNode(this.deps.db),
    ]);
    // The row's own reservation sits on a node already tried (excluded), so it does not count against others.
    return holdersFirst(
      rankNodes(
        nodes.filter((node) => !exclude.has(node.nodeId) && eligible(node)),
        reserved,
        { templateId: row.templateId, memoryMB: row.memoryMB },
        this.placementOptions(),
        this.recentPlacements,
      ),
      holders,
    );
  }

  /** Tries nodes best first; a node that refuses or fails is skipped for the next one. */
  private async place(
    row: SandboxRow,
    timeout: number,
    templateRef: string,
    firstChoiceNode: NodeHeartbeat | undefined,
    snapshot?: SnapshotRow,
    build?: BuildRecord,
    where: { eligible?: (node: NodeHeartbeat) => boolean; holders?: Set<string> } = {},
  ): Promise<SandboxRow> {
    let firstChoice = firstChoiceNode;
    const { db, nodeAgent, tokens, log, config } = this.deps;
    const tried = new Set<string>();
    const reasons: string[] = [];
    const fromSnapshot = {
      ...(snapshot ? await this.snapshotStart(snapshot, build) : {}),
      // A custom template's sandboxes come from a warm pool of its snapshot on the node, kept once used there.
      ...(build && snapshot ? { warmPool: true } : {}),
      // A custom template's last USER and WORKDIR are envd's defaults.
      ...(build?.defaultUser ? { defaultUser: build.defaultUser } : {}),
      ...(build?.defaultWorkdir ? { defaultWorkdir: build.defaultWorkdir } : {}),
    };
    // A snapshot is on one node: no other node can start it.
    const attempts = snapshot && !snapshot.digest ? 1 : config.placementAttempts;
    const waitUntil = Date.now() + config.templateWaitMs;
    let waited = false;
    for (let attempt = 0; attempt < attempts; attempt++) {
      // The admitted row already names the first choice; a retry moves the reservation to the next node.
      const node =
        attempt === 0 && firstChoice ? firstChoice : (await this.rank(row, tried, where.eligible, where.holders))[0];
      if (!node) break;
      if (node !== firstChoice) this.recentPlacements.record(node.nodeId, row.templateId);
      tried.add(node.nodeId);
      if (node.nodeId !== row.nodeId || attempt > 0) {
        await db.query("UPDATE sandboxes SET node_id = $2 WHERE id = $1 AND state = 'starting'", [row.id, node.nodeId]);
      }
      let placement: SandboxPlacement;
      try {
        if (snapshot) await ensureSnapshotOn(this.deps, snapshot, node, where.holders);
        placement = await nodeAgent(node.nodeId, node.addr).create({
          ...nodeCreateRequest(row, tokens),
          ...fromSnapshot,
        });
      } catch (error) {
        const reason = error instanceof Error ? error.message : String(error);
        if (isStillPreparing(error) && Date.now() < waitUntil) {
          // The node is still building the template (its first start) or still starting: wait for it within the
          // create's deadline rather than answer 503 at once.
          if (!waited)
            log.info("waiting for the node to build the template", { sandboxId: row.id, node: node.nodeId, reason });
          waited = true;
          tried.delete(node.nodeId);
          attempt--;
          await new Promise((resolve) => setTimeout(resolve, TEMPLATE_WAIT_POLL_MS));
          firstChoice = node;
          continue;
        }
        reasons.push(`${node.nodeId}: ${reason}`);
        log.warn("node refused sandbox", { sandboxId: row.id, node: node.nodeId, reason });
        continue;
      }
      if (build && (build.startCmd || build.readyCmd) && !snapshot?.memory) {
        // No memory in the template's snapshot (no CRIU here): its start command runs now, before the create
        // returns, as E2B's sandboxes have it running.
        const failure = await this.startTemplateProcess(row, build, nodeAgent(node.nodeId, node.addr));
        if (failure) {
          await this.failCreate(row, [failure]);
          throw new MasterError(
            "unavailable",
            `sandbox from template '${templateRef}' did not become ready: ${failure}`,
          );
        }
      }
      return await this.markStarted(row, node.nodeId, placement, timeout);
    }
    await this.failCreate(row, reasons);
    const detail = reasons.length > 0 ? `: ${reasons.join("; ")}` : "";
    throw new MasterError("unavailable", `no node could start a sandbox from template '${templateRef}'${detail}`);
  }

  /** Runs a template's start and ready commands in a just-created sandbox; the failure, or undefined. */
  private async startTemplateProcess(
    row: SandboxRow,
    build: BuildRecord,
    node: NodeAgentClient,
  ): Promise<string | undefined> {
    const abort = new AbortController();
    const timer = setTimeout(
      () => abort.abort(new Error("the template's ready command did not pass in time")),
      120_000,
    );
    try {
      await startAndAwaitReady({
        node,
        sandboxId: row.id,
        envdAccessToken: this.deps.tokens.envdToken(row.id, row.tokenNonce),
        context: { user: build.defaultUser ?? "user", workdir: build.defaultWorkdir, env: build.envVars },
        startCmd: build.startCmd,
        readyCmd: build.readyCmd,
        signal: abort.signal,
      });
      return undefined;
    } catch (error) {
      await node.kill(row.id).catch(() => undefined);
      return (error as Error).message;
    } finally {
      clearTimeout(timer);
    }
  }

  private async markStarted(
    row: SandboxRow,
    nodeId: string,
    placement: SandboxPlacement,
    timeout: number,
  ): Promise<SandboxRow> {
    const { db, nodeAgent, registry, log } = this.deps;
    const started = await markSandboxRunning(db, row.id, {
      nodeId,
      exec: placement.exec,
      envdVersion: placement.envdVersion ?? null,
      timeoutSeconds: timeout,
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
}

/** Whether a template ref names a team's namespace (`team/name:tag`); a ref that does not parse names none. */
function refNamesNamespace(ref: string): boolean {
  try {
    return parseTemplateName(ref).namespace !== undefined;
  } catch {
    return false;
  }
}
