import { existsSync } from "node:fs";
import { readFile, rm, rmdir, stat, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import { exec } from "./exec.js";
import { withFileLock } from "./file-lock.js";

/**
 * Team volumes kept as filesystems of their own: `<folder>.img`, a sparse ext4 image the size of the volume's quota,
 * loop-mounted at the volume's folder `<folder>` on the host where it was made. A sandbox writing past the quota
 * gets ENOSPC from the kernel (a bind of the folder is a bind of that filesystem), and so does the content API.
 *
 * Why images and not a project quota per folder on one filesystem: this node class's kernel has neither ext4's
 * quota formats (CONFIG_QFMT_V2) nor XFS quotas (see sandbox-disks.ts). An image is mounted by one host only (two
 * kernels mounting one ext4 would corrupt it), so image volumes serve the api and node agents of one host (`warren
 * up`); several hosts share plain folders on a filesystem whose server sets the quotas (NFS).
 *
 * Both the api (which makes, serves and destroys volumes) and the node agents (which bind them) call
 * `mountVolumeImage` before they use a folder: after a reboot the first of them mounts it again. A lock per volume
 * keeps two processes from mounting it twice; the image records the machine it belongs to, and another machine
 * refuses to mount it.
 */

/** mkfs options: a journal (a volume outlives crashes), no blocks reserved for root, sparse (lazy init). */
const MKFS_ARGS = ["-q", "-F", "-m", "0", "-I", "256", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0"];
/** Freed blocks are punched out of the image (discard), so deleting files gives the host its disk back. */
const MOUNT_OPTIONS = "loop,nodev,nosuid,noatime,discard";

export class VolumeImageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "VolumeImageError";
  }
}

const imageOf = (folder: string) => `${folder}.img`;
const ownerOf = (folder: string) => `${folder}.img.machine`;
const lockOf = (folder: string) => `${folder}.img.lock`;

async function machineId(): Promise<string> {
  return (await readFile("/etc/machine-id", "utf8").catch(() => "unknown")).trim() || "unknown";
}

/** Whether `folder` is the root of a mount (its device differs from its parent's). */
async function isMountPoint(folder: string): Promise<boolean> {
  const [own, parent] = await Promise.all([stat(folder).catch(() => undefined), stat(dirname(folder))]);
  return own !== undefined && own.dev !== parent.dev;
}

/** Whether the volume at `folder` is an image volume (else a plain folder). */
export function isVolumeImage(folder: string): boolean {
  return existsSync(imageOf(folder));
}

/**
 * Makes the volume at `folder` a filesystem of `sizeBytes` and mounts it there (the folder must exist, empty).
 * On failure nothing of the image is left.
 */
export async function createVolumeImage(folder: string, sizeBytes: number): Promise<void> {
  const image = imageOf(folder);
  // A failed make leaves nothing, the lock file included.
  const made = withFileLock(lockOf(folder), async () => {
    try {
      await exec("truncate", ["-s", String(sizeBytes), "--", image]);
      await exec("mkfs.ext4", [...MKFS_ARGS, image]);
      await writeFile(ownerOf(folder), `${await machineId()}\n`);
      await exec("mount", ["-o", MOUNT_OPTIONS, image, folder]);
      // E2B's volumes start empty: no lost+found.
      await rmdir(`${folder}/lost+found`).catch(() => undefined);
    } catch (error) {
      if (await isMountPoint(folder)) await exec("umount", ["--", folder], { allowFailure: true });
      await rm(image, { force: true });
      await rm(ownerOf(folder), { force: true });
      throw error;
    }
  });
  await made.catch(async (error: unknown) => {
    await rm(lockOf(folder), { force: true });
    throw error;
  });
}

/**
 * Mounts an image volume's filesystem at its folder if it is not mounted yet (after a reboot); a plain folder is
 * left alone. Resolves with whether the volume is an image.
 */
export async function mountVolumeImage(folder: string): Promise<boolean> {
  if (!isVolumeImage(folder)) return false;
  if (await isMountPoint(folder)) return true;
  await withFileLock(lockOf(folder), async () => {
    if (!isVolumeImage(folder) || (await isMountPoint(folder))) return;
    const owner = (await readFile(ownerOf(folder), "utf8").catch(() => "")).trim();
    if (owner !== (await machineId())) {
      throw new VolumeImageError(
        `the volume's filesystem belongs to another machine (${owner || "unknown"}): image volumes serve one host`,
      );
    }
    await exec("mount", ["-o", MOUNT_OPTIONS, imageOf(folder), folder]);
  });
  return true;
}

/**
 * Unmounts an image volume (lazily: sandboxes that bind it keep their view until they end, and the kernel frees
 * the loop device after them) and removes the image and the folder.
 */
export async function removeVolumeImage(folder: string): Promise<void> {
  await withFileLock(lockOf(folder), async () => {
    while (await isMountPoint(folder)) await exec("umount", ["--lazy", "--", folder]);
    await rm(imageOf(folder), { force: true });
    await rm(ownerOf(folder), { force: true });
    await rm(folder, { recursive: true, force: true });
  });
  await rm(lockOf(folder), { force: true });
}
