import { stat, statfs } from "node:fs/promises";
import { CapacityExceeded } from "../driver.js";

/**
 * A node refused a sandbox's disk: what it has already promised plus this disk is more than its free space allows.
 * The node agent answers `resource_exhausted`, so the master places the sandbox on another node.
 */
export class DiskBudgetExceeded extends CapacityExceeded {
  constructor(message: string, shortBytes: number) {
    super(message, Math.ceil(shortBytes / MiB));
    this.name = "DiskBudgetExceeded";
  }
}

/** One sandbox disk image the node has promised: its full size, and the sparse file that holds what is written. */
export interface DiskPromise {
  readonly image: string;
  readonly sizeBytes: number;
}

const MiB = 2 ** 20;

/** What a promise may still take from the node's disk: its size less the blocks its image already holds. */
async function unallocatedBytes(promise: DiskPromise): Promise<number> {
  const info = await stat(promise.image).catch(() => undefined);
  return Math.max(0, promise.sizeBytes - (info ? info.blocks * 512 : 0));
}

/**
 * Sandbox disks are sparse images (sandbox-disks.ts): filling one gives its writer ENOSPC, but only while the node's
 * own disk has room for the blocks. A node that promised more than it has turns a sandbox's full disk into an I/O
 * error once the host's disk is full. So a create is admitted only while every promise still fits: the free space
 * of the state directory's filesystem, times `overcommit` (1: never promise more than is free; above 1: accept that
 * risk for density), must cover what the live disks may still take plus the new one.
 */
export class DiskBudget {
  constructor(
    private readonly dir: string,
    private readonly overcommit: number,
  ) {
    if (!(overcommit > 0)) throw new Error(`disk overcommit must be a positive ratio, got ${overcommit}`);
  }

  /** Resolves when a disk of `sizeBytes` fits beside `promised`; throws DiskBudgetExceeded when it does not. */
  async admit(sizeBytes: number, promised: Iterable<DiskPromise>): Promise<void> {
    const fs = await statfs(this.dir);
    const free = fs.bavail * fs.bsize;
    let owed = 0;
    for (const promise of promised) owed += await unallocatedBytes(promise);
    const room = free * this.overcommit;
    if (owed + sizeBytes <= room) return;
    throw new DiskBudgetExceeded(
      `this node cannot promise a ${Math.round(sizeBytes / MiB)} MiB sandbox disk: ${Math.round(free / MiB)} MiB ` +
        `free, ${Math.round(owed / MiB)} MiB already promised to its sandboxes (WARREN_DISK_OVERCOMMIT=${this.overcommit})`,
      owed + sizeBytes - room,
    );
  }
}
