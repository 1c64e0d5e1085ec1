import type { Instance, SandboxResources } from "../runtime/driver.js";
import type { Logger } from "./log.js";
import { type IdlePool, type PoolStart, WarmPool, type WarmPoolOptions } from "./warm-pool.js";

interface SnapshotPool {
  readonly pool: WarmPool;
  readonly resources: SandboxResources;
  lastUsed: number;
}

/**
 * Warm pools of custom templates: sandboxes started ahead from a template's snapshot (its files, and its
 * processes where the snapshot holds memory), claimed by creates from that snapshot with the same resources.
 * A pool appears at a template's first create on this node (that create starts cold, and counts as the pool's
 * first demand), is sized by its demand like any warm pool (pool-sizing.ts), and the `max` most recently used
 * are kept; a deleted snapshot's pool goes with it.
 */
export class SnapshotPools {
  private readonly pools = new Map<string, SnapshotPool>();

  constructor(
    private readonly options: WarmPoolOptions,
    private readonly max: number,
    private readonly start: (
      templateId: string,
      snapshotId: string,
      resources: SandboxResources,
      start: PoolStart,
    ) => Promise<Instance>,
    private readonly discard: (instance: Instance) => Promise<void>,
    private readonly log: Logger,
  ) {}

  /** A warm sandbox of `snapshotId` with exactly `resources`, if one is ready. */
  take(snapshotId: string, resources: SandboxResources): Instance | undefined {
    const entry = this.pools.get(snapshotId);
    if (!entry || !sameResources(entry.resources, resources)) return undefined;
    entry.lastUsed = Date.now();
    return entry.pool.take();
  }

  /**
   * After a `take` that found nothing: the pool's next start to finish (WarmPool.next), or undefined when there is
   * no pool of `snapshotId` with exactly `resources` (the create starts on its own).
   */
  next(snapshotId: string, resources: SandboxResources, signal?: AbortSignal): Promise<Instance> | undefined {
    const entry = this.pools.get(snapshotId);
    if (!entry || !sameResources(entry.resources, resources)) return undefined;
    return entry.pool.next(signal);
  }

  /** Makes sure a pool of `snapshotId` exists (after a create from it), evicting the least recently used. */
  ensure(templateId: string, snapshotId: string, resources: SandboxResources): void {
    if (this.options.sizing.floor === 0 || this.max === 0) return;
    const existing = this.pools.get(snapshotId);
    if (existing && sameResources(existing.resources, resources)) {
      existing.lastUsed = Date.now();
      return;
    }
    if (existing) void this.drop(snapshotId);
    while (this.pools.size >= this.max) {
      const oldest = [...this.pools.entries()].sort((a, b) => a[1].lastUsed - b[1].lastUsed)[0];
      if (!oldest) break;
      void this.drop(oldest[0]);
    }
    const pool = new WarmPool(
      `${templateId}@${snapshotId}`,
      this.options,
      (start) => this.start(templateId, snapshotId, resources, start),
      this.discard,
      this.log,
    );
    this.pools.set(snapshotId, { pool, resources, lastUsed: Date.now() });
    pool.recordClaim();
  }

  /** Removes a snapshot's pool and its sandboxes. */
  async drop(snapshotId: string): Promise<void> {
    const entry = this.pools.get(snapshotId);
    if (!entry) return;
    this.pools.delete(snapshotId);
    await entry.pool.close().catch((error) => this.log.warn("closing a template pool failed", { snapshotId, error }));
  }

  /** Gives back ready sandboxes above each pool's target (WarmPool.trim). */
  async trim(): Promise<void> {
    for (const entry of [...this.pools.values()]) await entry.pool.trim();
  }

  async closeAll(): Promise<void> {
    for (const snapshotId of [...this.pools.keys()]) await this.drop(snapshotId);
  }

  /** The pools holding ready sandboxes, with the disk each of those was promised (sandbox-creation.ts makes room). */
  idlePools(): IdlePool[] {
    return [...this.pools.values()]
      .filter((entry) => entry.pool.readyCount > 0)
      .map((entry) => ({ pool: entry.pool, diskSizeMB: entry.resources.diskSizeMB }));
  }

  /** Ready sandboxes per pool (tests and benchmarks). */
  readyCounts(): Record<string, number> {
    return Object.fromEntries([...this.pools].map(([id, entry]) => [id, entry.pool.readyCount]));
  }
}

function sameResources(a: SandboxResources, b: SandboxResources): boolean {
  return (
    a.cpuCount === b.cpuCount && a.memoryMB === b.memoryMB && a.diskSizeMB === b.diskSizeMB && a.pidsMax === b.pidsMax
  );
}
