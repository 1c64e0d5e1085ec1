import { randomBytes } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import { effectiveEgress } from "../../runtime/egress/policy.js";
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
import { PhaseError } from "./phase-error.js";
import type { TemplateBuildConfig } from "./template-builder.js";

/** Where a build sandbox runs: the node's client and id. */
export interface PlacedBuild {
  readonly node: NodeAgentClient;
  readonly nodeId: string;
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
 * The build sandboxes of this master's builds: placed where the starting layer is (or any node of its driver,
 * which pulls it) with at most `maxConcurrentPerNode` builds per node while another node has room, created through
 * the node agent with no row in `sandboxes`, and removed when the build ends.
 */
export class BuildSandboxes {
  /** Builds of this master running on each node. */
  private readonly perNode = new Map<string, number>();

  constructor(private readonly deps: BuildSandboxesDeps) {}

  /** The node and the build sandbox: where the starting layer is, else the best node for the node template. */
  async start(
    build: BuildRecord,
    team: Team,
    base: BuildBase,
    snapshot: { id: string; nodeId: string } | undefined,
  ): Promise<PlacedBuild> {
    const { db, nodeAgent, tokens, config } = this.deps;
    // The starting layer's holders first; a published one may go to any node of its driver (which pulls it).
    const layer = snapshot ? await getLiveSnapshot(db, snapshot.id) : undefined;
    if (snapshot && !layer) throw new PhaseError("base", `the base layer ${snapshot.id} no longer exists`);
    const holders = layer ? await snapshotHolders(db, layer) : undefined;
    const node = await this.place(build, base, layer, holders);
    if (layer) {
      try {
        await ensureSnapshotOn(this.deps, layer, node, holders);
      } catch (error) {
        throw new PhaseError(
          "base",
          `the base layer could not be brought to node ${node.nodeId}: ${(error as Error).message}`,
        );
      }
    }
    const client = nodeAgent(node.nodeId, node.addr);
    this.perNode.set(node.nodeId, (this.perNode.get(node.nodeId) ?? 0) + 1);
    const sandboxId = build.buildSandboxId as string;
    try {
      await client.create({
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
      });
    } catch (error) {
      this.perNode.set(node.nodeId, (this.perNode.get(node.nodeId) ?? 1) - 1);
      throw new PhaseError("base", `the build sandbox did not start: ${(error as Error).message}`);
    }
    return { node: client, nodeId: node.nodeId };
  }

  /** Removes a build's sandbox from its node; the node has room for another build. */
  async release(placed: PlacedBuild, sandboxId: string): Promise<void> {
    await this.remove(placed.node, sandboxId);
    this.perNode.set(placed.nodeId, (this.perNode.get(placed.nodeId) ?? 1) - 1);
  }

  /** Removes a build sandbox from every live node (its build was abandoned by another master). */
  async removeEverywhere(sandboxId: string): Promise<void> {
    for (const node of await this.deps.registry.liveNodes()) {
      await this.remove(this.deps.nodeAgent(node.nodeId, node.addr), sandboxId);
    }
  }

  /** The best node that may run the build: one holding the layer or able to pull it, below its build limit first. */
  private async place(
    build: BuildRecord,
    base: BuildBase,
    layer: SnapshotRow | undefined,
    holders: Set<string> | undefined,
  ): Promise<NodeHeartbeat> {
    const { registry, config } = this.deps;
    const [nodes, reserved] = await Promise.all([registry.placeableNodes(), reservedMemoryByNode(this.deps.db)]);
    const ranked = holdersFirst(
      rankNodes(
        nodes.filter((n) => !layer || holders?.has(n.nodeId) || (layer.digest !== null && n.driver === layer.driver)),
        reserved,
        { templateId: base.nodeTemplateId, memoryMB: build.memoryMB },
        { memoryOvercommit: this.deps.memoryOvercommit },
      ),
      holders,
    );
    const node: NodeHeartbeat | undefined =
      ranked.find((n) => (this.perNode.get(n.nodeId) ?? 0) < config.maxConcurrentPerNode) ?? ranked[0];
    if (!node) {
      throw new PhaseError(
        "base",
        layer
          ? `no node holding the base layer (${[...(holders ?? [])].join(", ")}) can take a build now`
          : `no node can run template '${base.nodeTemplateId}' now`,
      );
    }
    return node;
  }

  private async remove(node: NodeAgentClient, sandboxId: string): Promise<void> {
    await node.kill(sandboxId).catch((error) => {
      if ((error as { kind?: string }).kind !== "not_found") {
        this.deps.log.warn("removing a build sandbox failed", { sandboxId, error: String(error) });
      }
    });
  }
}
