import { type Db, withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { getSandbox, type SandboxRow, toSandboxRow } from "../store/sandboxes.js";
import { notFound } from "./errors.js";
import {
  type LeaseEventOnNode,
  type NodeAgentConnector,
  NodeAgentError,
  type OomVictimOnNode,
} from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";
import type { TokenIssuer } from "./tokens.js";

const LEASE_EVENT_TYPES = new Set(["process.lease", "process.lease_renewed", "process.lease_reaped"]);

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

/** How long samples are kept (also after the sandbox ended, so its last hours stay visible). */
export const METRICS_RETENTION_HOURS = 24;
/** At most this many samples per answer (the newest). */
const MAX_SAMPLES = 2000;

/**
 * A sandbox's resource use over time: samples taken from its node (cgroup memory and CPU time, the writable
 * layer's use) are stored in PostgreSQL (`sandbox_metrics`), by the leader every WARREN_METRICS_INTERVAL_MS for
 * every running sandbox and whenever a caller asks; a caller gets the stored series plus a sample of now. CPU
 * percent is measured between this master's consecutive samples of the sandbox (or since it started).
 */
export class SandboxMetricsSampler {
  private readonly previous = new Map<string, { at: number; cpuUsec: number }>();
  /** Each sandbox's OOM kill count at its last sample, and the count its ledger has reported. */
  private readonly oomKills = new Map<string, number>();
  private readonly oomVictims = new Map<string, readonly OomVictimOnNode[]>();
  private readonly oomReported = new Map<string, number>();
  /** Each sandbox's last envd lease journal entry in the ledger (read back from it after a master restart). */
  private readonly leaseSeen = new Map<string, number>();

  constructor(
    private readonly deps: {
      readonly db: Db;
      readonly registry: NodeRegistry;
      readonly nodeAgent: NodeAgentConnector;
      /** With it, the pass also asks envd (through the node) for its process lease journal, for the ledger. */
      readonly tokens?: TokenIssuer;
    },
  ) {}

  /** The stored series of a sandbox of `teamId` (any state, within retention), with a sample of now if running. */
  async sample(sandboxId: string, teamId: string): Promise<SandboxMetricSample[]> {
    const row = await getSandbox(this.deps.db, sandboxId);
    if (!row || row.teamId !== teamId) throw notFound(sandboxId);
    await this.record(row);
    const result = await this.deps.db.query<{
      ts: Date;
      cpu_count: number;
      cpu_used_pct: number;
      mem_used: string;
      mem_total: string;
      disk_used: string;
      disk_total: string;
    }>(
      `SELECT * FROM (SELECT * FROM sandbox_metrics WHERE sandbox_id = $1 ORDER BY ts DESC LIMIT ${MAX_SAMPLES}) s
       ORDER BY ts`,
      [sandboxId],
    );
    return result.rows.map((r) => ({
      timestampMs: r.ts.getTime(),
      cpuCount: r.cpu_count,
      cpuUsedPct: r.cpu_used_pct,
      memUsed: Number(r.mem_used),
      memTotal: Number(r.mem_total),
      diskUsed: Number(r.disk_used),
      diskTotal: Number(r.disk_total),
    }));
  }

  /** The leader's pass: a sample of every running sandbox, then samples past retention are dropped. */
  async recordAll(): Promise<number> {
    const running = await this.deps.db.query("SELECT * FROM sandboxes WHERE state = 'running'");
    let recorded = 0;
    for (const raw of running.rows) {
      if (await this.record(toSandboxRow(raw))) recorded++;
    }
    await this.deps.db.query(
      `DELETE FROM sandbox_metrics WHERE ts < now() - interval '${METRICS_RETENTION_HOURS} hours'`,
    );
    return recorded;
  }

  /** Takes and stores a sample of a running sandbox; false when there is none to take (not running, node away). */
  private async record(row: SandboxRow): Promise<boolean> {
    const sample = await this.live(row);
    if (!sample) return false;
    await this.reportOomKills(row);
    await this.deps.db.query(
      `INSERT INTO sandbox_metrics (sandbox_id, team_id, ts, cpu_count, cpu_used_pct, mem_used, mem_total, disk_used,
         disk_total) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING`,
      [
        row.id,
        row.teamId,
        new Date(sample.timestampMs),
        sample.cpuCount,
        sample.cpuUsedPct,
        sample.memUsed,
        sample.memTotal,
        sample.diskUsed,
        sample.diskTotal,
      ],
    );
    return true;
  }

  /**
   * OOM kills since the last pass become `sandbox.oom` in the ledger (and so in the sandbox's logs): the count the
   * kernel keeps for the sandbox's cgroup, compared with the last one reported (read back from the ledger after a
   * master restart, so none is reported twice).
   */
  private async reportOomKills(row: SandboxRow): Promise<void> {
    const total = this.oomKills.get(row.id);
    if (total === undefined) return;
    let reported = this.oomReported.get(row.id);
    if (reported === undefined) {
      const last = await this.deps.db.query<{ total: string | null }>(
        "SELECT data->>'total' AS total FROM sandbox_events WHERE sandbox_id = $1 AND type = 'sandbox.oom' ORDER BY id DESC LIMIT 1",
        [row.id],
      );
      reported = Number(last.rows[0]?.total ?? 0);
    }
    if (total > reported) {
      await withTransaction(this.deps.db, (tx) =>
        appendEvent(tx, {
          sandboxId: row.id,
          teamId: row.teamId,
          type: "sandbox.oom",
          data: {
            kills: total - reported,
            total,
            memoryLimitMB: row.memoryMB,
            // The node names the newest kills where the kernel's log tells it: the process and what it held.
            victims: (this.oomVictims.get(row.id) ?? []).slice(-(total - reported)).map((v) => ({
              process: v.process,
              memoryMB: Math.round(v.memoryBytes / 2 ** 20),
              at: v.at,
            })),
          },
        }),
      );
    }
    this.oomReported.set(row.id, Math.max(total, reported));
    if (this.oomReported.size > 10_000) this.oomReported.delete(this.oomReported.keys().next().value as string);
  }

  private async leaseCursor(sandboxId: string): Promise<number> {
    const seen = this.leaseSeen.get(sandboxId);
    if (seen !== undefined) return seen;
    const last = await this.deps.db.query<{ seq: string | null }>(
      `SELECT data->>'seq' AS seq FROM sandbox_events WHERE sandbox_id = $1 AND type LIKE 'process.lease%'
       ORDER BY id DESC LIMIT 1`,
      [sandboxId],
    );
    const cursor = Number(last.rows[0]?.seq ?? 0);
    this.leaseSeen.set(sandboxId, cursor);
    if (this.leaseSeen.size > 10_000) this.leaseSeen.delete(this.leaseSeen.keys().next().value as string);
    return cursor;
  }

  /** envd's lease journal since the last pass becomes `process.lease`, `process.lease_renewed`, `process.lease_reaped`. */
  private async reportLeaseEvents(row: SandboxRow, events: readonly LeaseEventOnNode[]): Promise<void> {
    const cursor = await this.leaseCursor(row.id);
    const fresh = events.filter((e) => e.seq > cursor && LEASE_EVENT_TYPES.has(e.type));
    if (fresh.length === 0) return;
    await withTransaction(this.deps.db, async (tx) => {
      for (const e of fresh) {
        await appendEvent(tx, {
          sandboxId: row.id,
          teamId: row.teamId,
          type: e.type,
          data: {
            seq: e.seq,
            pid: e.pid,
            ...(e.tag ? { tag: e.tag } : {}),
            ttlMs: e.ttlMs,
            ...(e.signal ? { signal: e.signal } : {}),
            at: e.at,
          },
        });
      }
    });
    this.leaseSeen.set(row.id, Math.max(...fresh.map((e) => e.seq)));
  }

  private async live(row: SandboxRow): Promise<SandboxMetricSample | undefined> {
    const sandboxId = row.id;
    if (row.state !== "running" || !row.nodeId) return undefined;
    const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
    if (!node) return undefined;
    let stats: Awaited<ReturnType<ReturnType<NodeAgentConnector>["stats"]>>;
    const leases = this.deps.tokens
      ? { envdAccessToken: this.deps.tokens.envdToken(row.id, row.tokenNonce), after: await this.leaseCursor(row.id) }
      : undefined;
    try {
      stats = await this.deps.nodeAgent(node.nodeId, node.addr).stats(sandboxId, leases);
    } catch (error) {
      if (error instanceof NodeAgentError) return undefined;
      throw error;
    }
    if (stats.leaseEvents?.length) await this.reportLeaseEvents(row, stats.leaseEvents);
    if (stats.oomKills !== undefined) this.oomKills.set(sandboxId, stats.oomKills);
    if (stats.oomVictims?.length) this.oomVictims.set(sandboxId, stats.oomVictims);
    else this.oomVictims.delete(sandboxId);
    if (this.oomKills.size > 10_000) this.oomKills.delete(this.oomKills.keys().next().value as string);
    if (this.oomVictims.size > 10_000) this.oomVictims.delete(this.oomVictims.keys().next().value as string);
    const now = Date.now();
    const before = this.previous.get(sandboxId) ?? { at: row.startedAt.getTime(), cpuUsec: 0 };
    this.previous.set(sandboxId, { at: now, cpuUsec: stats.cpuUsageUsec });
    if (this.previous.size > 10_000) this.previous.delete(this.previous.keys().next().value as string);
    const wallUsec = Math.max(1, (now - before.at) * 1000) * Math.max(row.cpuCount, 1);
    const cpuUsedPct = Math.min(100, Math.max(0, ((stats.cpuUsageUsec - before.cpuUsec) / wallUsec) * 100));
    return {
      timestampMs: now,
      cpuCount: row.cpuCount,
      cpuUsedPct: Math.round(cpuUsedPct * 100) / 100,
      memUsed: stats.memoryUsageBytes,
      memTotal: stats.memoryLimitBytes || row.memoryMB * 1024 * 1024,
      diskUsed: stats.diskUsageBytes,
      diskTotal: stats.diskLimitBytes,
    };
  }
}
