import { randomBytes } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import { effectiveEgress } from "../../runtime/egress/policy.js";
import { claimBuildSlot, releaseBuildSlot } from "../../store/build-slots.js";
import type { Db } from "../../store/db.js";
import { reservedMemoryByNode } from "../../store/nodes.js";
import { getLiveSnapshot, type SnapshotRow, snapshotHolders } from "../../store/snapshots.js";
import type { Team } from "../../store/teams.js";
import type { BuildRecord } from "../../store/templates.js";
import type { Logger } from "../log.js";
import type { NodeAgentClient, NodeAgentConnector } from "../node-agent-client.js";
import type { NodeRegistry } from "../node-registry.js";
import { rankNodes } from "../placement.js";
import { ensureSnapshotOn, holdersFirst } from "../snapshot-copies.js";
import type { TokenIssuer } from "../tokens.js";
import type { BuildBase } from "./build-base.js";
import type { BuildLog } from "./build-log.js";
import { PhaseError } from "./phase-error.js";
import type { TemplateBuildConfig } from "./template-builder.js";

/** Where a build sandbox runs: the node's client and id, and the build whose slot it holds. */
export interface PlacedBuild {
  readonly node: NodeAgentClient;
  readonly nodeId: string;
  readonly buildId: string;
}

export interface BuildSandboxesDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly tokens: TokenIssuer;
  readonly config: TemplateBuildConfig;
  readonly memoryOvercommit: number;
  readonly log: Logger;
}

/**
 * How often a queued build looks again without a release here: another master's build may have ended, or a node
 * joined or come back meanwhile.
 */
const QUEUE_RECHECK_MS = 1_000;

/**
 * The build sandboxes of this master's builds: placed where the starting layer is (or any node of its driver,
 * which pulls it) with at most `maxConcurrentPerNode` builds per node, counted over every master (PostgreSQL,
 * build-slots.ts); a build that finds every such node full waits its turn (oldest first, within its deadline) for
 * one of them to finish. Created through the node agent with no row in `sandboxes`, and removed when the build ends.
 */
export class BuildSandboxes {
  /** This master's queued builds: each looks again when a build here gives a slot back. */
  private readonly waiters = new Set<() => void>();

  constructor(private readonly deps: BuildSandboxesDeps) {}

  /** The node and the build sandbox: where the starting layer is, else the best node for the node template. */
  async start(
    build: BuildRecord,
    team: Team,
    base: BuildBase,
    snapshot: { id: string; nodeId: string } | undefined,
    queued: { readonly signal: AbortSignal; readonly buildLog: BuildLog },
  ): Promise<PlacedBuild> {
    const { db, nodeAgent, tokens, config } = this.deps;
    // The starting layer's holders first; a published one may go to any node of its driver (which pulls it).
    const layer = snapshot ? await getLiveSnapshot(db, snapshot.id) : undefined;
    if (snapshot && !layer) throw new PhaseError("base", `the base layer ${snapshot.id} no longer exists`);
    const holders = layer ? await snapshotHolders(db, layer) : undefined;
    // From here the node's slot is this build's: every failure below gives it back.
    const node = await this.place(build, base, layer, holders, queued);
    const client = nodeAgent(node.nodeId, node.addr);
    const sandboxId = build.buildSandboxId as string;
    try {
      if (layer) {
        await ensureSnapshotOn(this.deps, layer, node, holders).catch((error: Error) => {
          throw new PhaseError("base", `the base layer could not be brought to node ${node.nodeId}: ${error.message}`);
        });
      }
      await client
        .create({
          sandboxId,
          teamId: team.id,
          templateId: base.nodeTemplateId,
          resources: { cpuCount: build.cpuCount, memoryMB: build.memoryMB, diskSizeMB: config.diskMB },
          envVars: {},
          envdAccessToken: tokens.envdToken(sandboxId, build.tokenNonce as string),
          trafficTokenHash: randomBytes(32).toString("hex"),
          publicTraffic: false,
          autoResume: false,
          metadata: { "warren.templateBuild": build.id },
          // Build steps reach what the team's sandboxes may reach (E2B's default: the internet), never more.
          egress: effectiveEgress(null, null, team.egressMode),
          ...(snapshot ? { snapshotId: snapshot.id } : {}),
          defaultUser: "root",
          defaultWorkdir: "/",
        })
        .catch((error: Error) => {
          throw new PhaseError("base", `the build sandbox did not start: ${error.message}`);
        });
    } catch (error) {
      await this.freeSlot(build.id);
      throw error;
    }
    return { node: client, nodeId: node.nodeId, buildId: build.id };
  }

  /** Removes a build's sandbox from its node; the node has room for another build. */
  async release(placed: PlacedBuild, sandboxId: string): Promise<void> {
    await this.remove(placed.node, sandboxId);
    await this.freeSlot(placed.buildId);
  }

  /** Gives a build's slot back (or its place in the queue) and wakes this master's queued builds to look again. */
  private async freeSlot(buildId: string): Promise<void> {
    await releaseBuildSlot(this.deps.db, buildId).catch((error) =>
      // Not lost: a build slot counts only while its build is `building`, which it stops being next.
      this.deps.log.warn("giving a build slot back failed", { buildId, error: String(error) }),
    );
    for (const wake of this.waiters) wake();
  }

  /** Removes a build sandbox from every live node (its build was abandoned by another master). */
  async removeEverywhere(sandboxId: string): Promise<void> {
    for (const node of await this.deps.registry.liveNodes()) {
      await this.remove(this.deps.nodeAgent(node.nodeId, node.addr), sandboxId);
    }
  }

  /**
   * The best node that may run the build (one holding the layer or able to pull it) with a free build slot, which
   * it takes. While every such node is full the build waits its turn in the queue: until a slot frees, or its
   * signal (deadline, cancel) ends the wait.
   */
  private async place(
    build: BuildRecord,
    base: BuildBase,
    layer: SnapshotRow | undefined,
    holders: Set<string> | undefined,
    { signal, buildLog }: { readonly signal: AbortSignal; readonly buildLog: BuildLog },
  ): Promise<NodeHeartbeat> {
    const { registry, config, db } = this.deps;
    let wake: () => void = () => undefined;
    const waiter = () => wake();
    try {
      for (;;) {
        signal.throwIfAborted();
        const [nodes, reserved] = await Promise.all([registry.placeableNodes(), reservedMemoryByNode(db)]);
        const ranked = holdersFirst(
          rankNodes(
            nodes.filter(
              (n) =>
                (!base.onNode || n.nodeId === base.onNode) &&
                (!layer || holders?.has(n.nodeId) || (layer.digest !== null && n.driver === layer.driver)),
            ),
            reserved,
            { templateId: base.nodeTemplateId, memoryMB: build.memoryMB },
            { memoryOvercommit: this.deps.memoryOvercommit },
          ),
          holders,
        );
        if (ranked.length === 0) {
          throw new PhaseError(
            "base",
            layer
              ? `no node holding the base layer (${[...(holders ?? [])].join(", ")}) can take a build now`
              : `no node can run template '${base.nodeTemplateId}' now`,
          );
        }
        const claim = await claimBuildSlot(
          db,
          build.id,
          ranked.map((n) => n.nodeId),
          config.maxConcurrentPerNode,
        );
        const node = "nodeId" in claim ? ranked.find((n) => n.nodeId === claim.nodeId) : undefined;
        if (node) return node;
        if ("queuedAhead" in claim && claim.newlyQueued) {
          buildLog.info(
            `[base] waiting for a build slot: every node that can run this build already runs ${config.maxConcurrentPerNode} (${claim.queuedAhead} queued ahead)`,
            "base",
          );
        }
        this.waiters.add(waiter);
        await new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(timer);
            signal.removeEventListener("abort", done);
            resolve();
          };
          const timer = setTimeout(done, QUEUE_RECHECK_MS);
          signal.addEventListener("abort", done, { once: true });
          wake = done;
        });
      }
    } catch (error) {
      // Out of the queue: the next build may take what this one leaves (or the slot it could not use).
      this.waiters.delete(waiter);
      await this.freeSlot(build.id);
      throw error;
    } finally {
      this.waiters.delete(waiter);
    }
  }

  private async remove(node: NodeAgentClient, sandboxId: string): Promise<void> {
    await node.kill(sandboxId).catch((error) => {
      if ((error as { kind?: string }).kind !== "not_found") {
        this.deps.log.warn("removing a build sandbox failed", { sandboxId, error: String(error) });
      }
    });
  }
}
