import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, rename, rm, rmdir } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { exec } from "../exec.js";

/**
 * Mounts the stack read-only in a private mount namespace (so the mount never shows in the host's, and goes with
 * the process) and copies what it shows: overlayfs itself applies the layers' whiteouts and opaque folders, so
 * the copy is the tree a sandbox over the same stack sees. Owners, modes, links, xattrs (file capabilities) and
 * timestamps are kept by `cp -a`.
 */
const FLATTEN = `set -e
mount -t overlay -o "ro,lowerdir=$LOWER" warren-flatten "$MNT"
cp -a "$MNT/." "$DEST/"
`;

/**
 * One directory with the tree of `layers` (topmost first) over `lowerRootfs`: a snapshot's files as a plain root
 * filesystem, e.g. for a template built by the template builder to become a node's template. `dest` must not
 * exist; it appears whole (renamed from a sibling) or not at all.
 */
export async function flattenLayers(layers: readonly string[], lowerRootfs: string, dest: string): Promise<void> {
  if (existsSync(dest)) throw new Error(`${dest} already exists`);
  const staging = join(dirname(dest), `.${basename(dest)}.flatten-${randomBytes(4).toString("hex")}`);
  const mountPoint = `${staging}.mnt`;
  try {
    await mkdir(staging, { recursive: true });
    if (layers.length === 0) {
      await exec("cp", ["-a", `${lowerRootfs}/.`, `${staging}/`]);
    } else {
      await mkdir(mountPoint);
      await exec("unshare", ["--mount", "--propagation", "private", "sh", "-c", FLATTEN], {
        env: { LOWER: [...layers, lowerRootfs].join(":"), MNT: mountPoint, DEST: staging },
      });
    }
    await rename(staging, dest);
  } finally {
    await rm(staging, { recursive: true, force: true });
    // Never recursive: were the stack still mounted there, a recursive removal would reach into it.
    await rmdir(mountPoint).catch(() => undefined);
  }
}
