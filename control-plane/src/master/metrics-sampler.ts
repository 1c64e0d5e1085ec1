import type { Db } from "../store/db.js";
import { getSandbox } from "../store/sandboxes.js";
import { notFound } from "./errors.js";
import { type NodeAgentConnector, NodeAgentError } from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";

/** E2B's SandboxMetric, one sample. */
export interface SandboxMetricSample {
  readonly timestampMs: number;
  readonly cpuCount: number;
  readonly cpuUsedPct: number;
  readonly memUsed: number;
  readonly memTotal: number;
  readonly diskUsed: number;
  readonly diskTotal: number;
}

/**
 * Samples a running sandbox's resource use from its node when asked (cgroup memory and CPU time, the
 * writable layer's use). CPU percent is measured between this master's consecutive samples of the sandbox,
 * or since the sandbox started for the first one. There is no stored time series yet: a caller sees the
 * present, which is what E2B's "eventually non-empty" metrics need and no more.
 */
export class SandboxMetricsSampler {
  private readonly previous = new Map<string, { at: number; cpuUsec: number }>();

  constructor(
    private readonly deps: { readonly db: Db; readonly registry: NodeRegistry; readonly nodeAgent: NodeAgentConnector },
  ) {}

  async sample(sandboxId: string, teamId: string): Promise<SandboxMetricSample[]> {
    const row = await getSandbox(this.deps.db, sandboxId);
    if (!row || row.teamId !== teamId) throw notFound(sandboxId);
    if (row.state !== "running" || !row.nodeId) return [];
    const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
    if (!node) return [];
    let stats: Awaited<ReturnType<ReturnType<NodeAgentConnector>["stats"]>>;
    try {
      stats = await this.deps.nodeAgent(node.nodeId, node.addr).stats(sandboxId);
    } catch (error) {
      if (error instanceof NodeAgentError) return [];
      throw error;
    }
    const now = Date.now();
    const before = this.previous.get(sandboxId) ?? { at: row.startedAt.getTime(), cpuUsec: 0 };
    this.previous.set(sandboxId, { at: now, cpuUsec: stats.cpuUsageUsec });
    if (this.previous.size > 10_000) this.previous.delete(this.previous.keys().next().value as string);
    const wallUsec = Math.max(1, (now - before.at) * 1000) * Math.max(row.cpuCount, 1);
    const cpuUsedPct = Math.min(100, Math.max(0, ((stats.cpuUsageUsec - before.cpuUsec) / wallUsec) * 100));
    return [
      {
        timestampMs: now,
        cpuCount: row.cpuCount,
        cpuUsedPct: Math.round(cpuUsedPct * 100) / 100,
        memUsed: stats.memoryUsageBytes,
        memTotal: stats.memoryLimitBytes || row.memoryMB * 1024 * 1024,
        diskUsed: stats.diskUsageBytes,
        diskTotal: stats.diskLimitBytes,
      },
    ];
  }
}
