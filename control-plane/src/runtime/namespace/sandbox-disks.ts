import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, chown, mkdir, readdir, rename, rm, rmdir } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { exec } from "../exec.js";
import { unmountTree } from "./mounts.js";

/**
 * How a sandbox's writable layer (the overlay's upper and work dirs) is stored:
 * - `image`: an ext4 filesystem in a sparse file of the sandbox's disk size (`<instance>/disk.img`), loop-mounted
 *   with direct I/O at `<instance>/disk`. Filling it gives the writer ENOSPC and nothing else; its blocks are on
 *   the node's disk, so only page cache (reclaimable) is charged to the sandbox's memory cgroup.
 * - `tmpfs`: a size-limited tmpfs, whose pages are charged to the sandbox's memory cgroup (disk and memory are one
 *   budget; a full disk can end in an OOM kill). Only where the probe could not loop-mount an image.
 */
export type DiskKind = "image" | "tmpfs";

/** A sandbox disk's mount options (`noinit_itable`: see MKFS_ARGS). */
const DISK_MOUNT_OPTIONS = "nodev,noatime,noinit_itable";

/**
 * Shell (`set -e`): makes a sandbox disk at $MNT from the formatted $DISK_TEMPLATE, as the sparse image file $IMG,
 * loop-mounted with direct I/O (no second copy of its pages in the host's page cache). `losetup -d` of the mounted
 * device only marks it to be freed when the filesystem is unmounted. The formatted image already holds the overlay's
 * upper and work dirs (`format`), so the disk is ready once mounted. SandboxDisks.makeReady runs the same steps (or
 * `warren-exec --ready-disk` does, in one exec).
 */
export const MAKE_DISK = `cp --sparse=always "$DISK_TEMPLATE" "$IMG"
L=$(losetup --find --show --direct-io=on "$IMG")
mount -o ${DISK_MOUNT_OPTIONS} "$L" "$MNT" || { losetup -d "$L"; exit 1; }
losetup -d "$L"
`;

/**
 * Shell (`set -e`): the overlay's upper and work dirs on a tmpfs writable layer at $MNT, upper owned by sandbox root
 * (a disk image has them from its formatted image).
 */
export const MAKE_LAYER_DIRS = `mkdir "$MNT/upper" "$MNT/work"
chown "$UID_BASE:$UID_BASE" "$MNT/upper"
chmod 0755 "$MNT/upper"
`;

/** Ready disks kept per size, for the most recently used sizes. */
const READY_PER_SIZE = 2;
const READY_SIZES = 4;

/**
 * What the launcher (instance-container.ts MOUNT_ROOT) gets to mount one sandbox's writable layer, as environment
 * variables: DISK_READY (a ready disk, already mounted with its layer dirs, to move into place; its image file is
 * already in the instance directory), DISK_TEMPLATE (make one from this formatted image), or neither (a tmpfs).
 */
export type DiskLaunch = Readonly<Record<string, string>>;

/**
 * mkfs options of a sandbox disk. No journal: a sandbox disk never outlives its mount (each sandbox starts from a
 * fresh copy of a formatted image), so there is nothing to replay, and writes go straight to their blocks. No
 * blocks reserved for root (sandbox root is the sandbox's own). Inode tables are left unzeroed (lazy_itable_init)
 * and the mount says `noinit_itable`, so neither mkfs nor the kernel writes them: the image stays sparse.
 * 256-byte inodes at every size (mkfs gives small filesystems 128): they keep nanosecond times, which incremental
 * snapshots of the writable layer compare (layer-diff.ts).
 */
const MKFS_ARGS = ["-q", "-F", "-m", "0", "-O", "^has_journal", "-I", "256"];

/**
 * The formatted image of a disk size: `disk-<MiB>m.img`, with the overlay's layer dirs in it. Images of an earlier
 * Warren (`ext4-<MiB>m.img`, without them) are removed by the probe.
 */
const formattedImageName = (diskSizeMB: number) => `disk-${diskSizeMB}m.img`;
const EARLIER_FORMATTED_IMAGE = /^ext4-\d+m\.img$/;

/**
 * Writable layers of this agent's sandboxes: which kind the node gets (the start-up probe); one formatted, sparse
 * ext4 image per disk size, made once (mkfs: 30–60 ms here); and a few ready disks of each recently used size
 * (`<dir>/ready/<id>`: copied and loop-mounted), so a create only moves one into place — the copy and
 * the loop device set-up (tens of ms on a busy host) happen off the create path. A create that finds none makes
 * its disk in the launcher. Ready disks are unmounted at close and, after a crash, by the next start's probe.
 *
 * Why not one filesystem with a project quota per sandbox: it is cheaper per create (no loop device), but this
 * node class's kernel has neither ext4's quota formats (CONFIG_QFMT_V2) nor XFS quotas (CONFIG_XFS_QUOTA), and an
 * exceeded project quota reports EDQUOT, not ENOSPC, on ext4.
 */
export class SandboxDisks {
  private kindFound: DiskKind = "tmpfs";
  private readonly making = new Map<number, Promise<string>>();
  private readonly readyDir: string;
  /** Ready disks (their mount points; image at `<mount>.img`) by size in MiB. */
  private readonly ready = new Map<number, string[]>();
  /** Sizes to keep ready disks of, most recently used first. */
  private wanted: number[] = [];
  private filling: Promise<void> | undefined;
  private closed = false;

  constructor(
    /** `<stateDir>/disks`: the formatted images (one per size) and the ready disks. */
    private readonly dir: string,
    private readonly uidBase: number,
    private readonly log: Logger,
    /** envd's static launcher, which makes a disk in one exec (`warren-exec --ready-disk`) where it is built. */
    private readonly launcher?: string,
  ) {
    this.readyDir = join(dir, "ready");
  }

  get kind(): DiskKind {
    return this.kindFound;
  }

  /**
   * Decides the kind: `image` when an image can be made and loop-mounted here (needs mkfs.ext4, loop devices and
   * the right to use them), else `tmpfs`, logged. Leftovers of a crashed mkfs are removed.
   */
  async probe(): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    for (const name of await readdir(this.dir)) {
      if (name.startsWith(".") || EARLIER_FORMATTED_IMAGE.test(name))
        await rm(join(this.dir, name), { recursive: true, force: true });
    }
    // Ready disks of a previous run (a crash, or a stop while one was being made).
    await unmountTree(this.readyDir);
    await rm(this.readyDir, { recursive: true, force: true });
    await mkdir(this.readyDir);
    try {
      // The very steps of a sandbox's disk (format, copy, loop device with direct I/O, mount), at 64 MiB.
      await this.discard(await this.makeReady(64));
      this.kindFound = "image";
      this.log.info("sandbox disks are ext4 images on the node's disk", { dir: this.dir });
    } catch (error) {
      this.kindFound = "tmpfs";
      this.log.warn("no loop-mounted sandbox disks here: writable layers are tmpfs (disk counts as memory)", {
        error,
      });
    }
  }

  /**
   * How the launcher mounts the disk of an instance of `diskSizeMB` in `instanceDir`: a ready disk when there is one
   * (its image moves into the instance directory now), else the formatted image to copy. Call `launched` once the
   * launcher has run, whether it succeeded or not.
   */
  async forInstance(instanceDir: string, diskSizeMB: number): Promise<DiskLaunch> {
    if (this.kindFound === "tmpfs") return {};
    this.want(diskSizeMB);
    const mount = this.ready.get(diskSizeMB)?.shift();
    this.refill();
    if (mount) {
      try {
        await rename(`${mount}.img`, join(instanceDir, "disk.img"));
        return { DISK_READY: mount };
      } catch (error) {
        this.log.warn("a ready sandbox disk could not be used", { mount, error });
        await this.discard(mount);
      }
    }
    return { DISK_TEMPLATE: await this.template(diskSizeMB) };
  }

  /** After the launcher: a ready disk's empty mount point goes (a disk the launcher did not move is unmounted). */
  async launched(launch: DiskLaunch): Promise<void> {
    const mount = launch.DISK_READY;
    if (!mount) return;
    try {
      await rmdir(mount);
    } catch {
      await unmountTree(mount);
      await rm(mount, { recursive: true, force: true });
    }
  }

  /** Unmounts the ready disks (the agent stops). */
  async close(): Promise<void> {
    this.closed = true;
    await this.filling;
    for (const mounts of this.ready.values()) for (const mount of mounts) await this.discard(mount);
    this.ready.clear();
  }

  private want(diskSizeMB: number): void {
    this.wanted = [diskSizeMB, ...this.wanted.filter((size) => size !== diskSizeMB)];
    for (const size of this.wanted.splice(READY_SIZES)) {
      const mounts = this.ready.get(size) ?? [];
      this.ready.delete(size);
      for (const mount of mounts) void this.discard(mount);
    }
  }

  /** Makes ready disks, one at a time, until every wanted size has READY_PER_SIZE. */
  private refill(): void {
    if (this.filling || this.closed) return;
    this.filling = (async () => {
      for (;;) {
        const size = this.wanted.find((s) => (this.ready.get(s)?.length ?? 0) < READY_PER_SIZE);
        if (size === undefined || this.closed) return;
        const mount = await this.makeReady(size);
        if (this.wanted.includes(size)) this.ready.set(size, [...(this.ready.get(size) ?? []), mount]);
        else await this.discard(mount);
      }
    })()
      .catch((error) => this.log.warn("making a ready sandbox disk failed", { error }))
      .finally(() => {
        this.filling = undefined;
      });
  }

  private async makeReady(diskSizeMB: number): Promise<string> {
    const mount = join(this.readyDir, randomBytes(6).toString("hex"));
    await mkdir(mount);
    try {
      const image = `${mount}.img`;
      const formatted = await this.template(diskSizeMB);
      if (this.launcher && existsSync(this.launcher)) {
        // MAKE_DISK's steps by system call: one exec instead of four (execs are most of the CPU a refill costs).
        await exec(this.launcher, ["--ready-disk", formatted, image, mount]);
        return mount;
      }
      // MAKE_DISK's steps, each exec'd directly: no shell, no subshell.
      await exec("cp", ["--sparse=always", formatted, image]);
      const loop = (await exec("losetup", ["--find", "--show", "--direct-io=on", image])).stdout.trim();
      try {
        await exec("mount", ["-o", DISK_MOUNT_OPTIONS, loop, mount]);
      } finally {
        await exec("losetup", ["-d", loop], { allowFailure: true });
      }
      return mount;
    } catch (error) {
      await this.discard(mount);
      throw error;
    }
  }

  private async discard(mount: string): Promise<void> {
    await unmountTree(mount);
    await rm(mount, { recursive: true, force: true });
    await rm(`${mount}.img`, { force: true });
  }

  /** The formatted image of `diskSizeMB` (made once; concurrent callers share the making). */
  private template(diskSizeMB: number): Promise<string> {
    if (!Number.isInteger(diskSizeMB) || diskSizeMB < 16) throw new Error(`invalid disk size ${diskSizeMB} MiB`);
    const path = join(this.dir, formattedImageName(diskSizeMB));
    if (existsSync(path)) return Promise.resolve(path);
    let making = this.making.get(diskSizeMB);
    if (!making) {
      making = this.format(path, diskSizeMB).finally(() => this.making.delete(diskSizeMB));
      this.making.set(diskSizeMB, making);
    }
    return making;
  }

  private async format(path: string, diskSizeMB: number): Promise<string> {
    const tmp = join(this.dir, `.${randomBytes(6).toString("hex")}`);
    try {
      // The root directory and the overlay's upper dir belong to sandbox root, as on a tmpfs layer (MAKE_LAYER_DIRS);
      // the work dir to host root. mkfs copies them in (`-d`), so every copy of the image is ready once mounted.
      const layout = `${tmp}.layout`;
      await mkdir(join(layout, "upper"), { recursive: true, mode: 0o755 });
      await mkdir(join(layout, "work"), { mode: 0o755 });
      for (const owned of [layout, join(layout, "upper")]) {
        await chown(owned, this.uidBase, this.uidBase);
        await chmod(owned, 0o755);
      }
      const extended = `nodiscard,lazy_itable_init=1,root_owner=${this.uidBase}:${this.uidBase}`;
      await exec("mkfs.ext4", [...MKFS_ARGS, "-E", extended, "-d", layout, `${tmp}.img`, `${diskSizeMB}M`]);
      await rename(`${tmp}.img`, path);
      return path;
    } finally {
      await rm(`${tmp}.img`, { force: true });
      await rm(`${tmp}.layout`, { recursive: true, force: true });
    }
  }
}
