import type { BigIntStats } from "node:fs";
import { lstat, readdir, readlink, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * What a child template's build changed in the copy of its parent's root filesystem: the entries to ship over the
 * parent (relative paths, parents before children, every ancestor of a changed entry included so that its owner
 * and mode travel too) and the parent's entries to delete first (gone in the child, or replaced by another type).
 */
export interface RootfsDiff {
  readonly entries: readonly string[];
  readonly deletions: readonly string[];
}

/**
 * Compares `child` (a copy of `parent` that build steps then changed) with `parent`. An entry counts as changed
 * when it is new, its type, owner, mode, size, modification time or link target differs, or its inode changed
 * after `changedSinceCtimeNs` (`markCopyEnd`'s answer): that last test catches what leaves every other attribute
 * alone, like a capability set on an existing file.
 */
export async function diffRootfs(parent: string, child: string, changedSinceCtimeNs: bigint): Promise<RootfsDiff> {
  const entries: string[] = [];
  const deletions: string[] = [];
  const changed = (a: BigIntStats, b: BigIntStats) =>
    a.ctimeNs > changedSinceCtimeNs ||
    a.mode !== b.mode ||
    a.uid !== b.uid ||
    a.gid !== b.gid ||
    (!a.isDirectory() && (a.size !== b.size || a.mtimeNs !== b.mtimeNs));

  /** Adds `path` and, depth first, what below it differs; `known` is the parent's entry at the same path. */
  const visit = async (path: string, here: BigIntStats, known: BigIntStats | undefined): Promise<boolean> => {
    let differs = known === undefined || changed(here, known);
    if (!differs && here.isSymbolicLink()) {
      differs = (await readlink(join(child, path))) !== (await readlink(join(parent, path)));
    }
    if (known && (here.mode & 0o170000n) !== (known.mode & 0o170000n)) {
      deletions.push(path);
      known = undefined;
    }
    const at = entries.length;
    entries.push(path);
    let below = false;
    if (here.isDirectory()) {
      const names = (await readdir(join(child, path))).sort();
      const parentNames = known ? new Set(await readdir(join(parent, path))) : new Set<string>();
      const sub = (name: string) => (path === "." ? name : `${path}/${name}`);
      // A directory's entries are looked at together (the thread pool's parallelism), then visited in order.
      const stats = await Promise.all(
        names.map(async (name) => {
          const theirs = parentNames.has(name) ? lstat(join(parent, sub(name)), { bigint: true }) : undefined;
          return [await lstat(join(child, sub(name)), { bigint: true }), await theirs] as const;
        }),
      );
      for (const [i, name] of names.entries()) {
        const [ours, theirs] = stats[i] as readonly [BigIntStats, BigIntStats | undefined];
        if (await visit(sub(name), ours, theirs)) below = true;
        parentNames.delete(name);
      }
      for (const gone of [...parentNames].sort()) deletions.push(sub(gone));
      if (parentNames.size > 0) differs = true;
    }
    if (!differs && !below) entries.length = at;
    return differs || below;
  };
  await visit(".", await lstat(child, { bigint: true }), await lstat(parent, { bigint: true }));
  return { entries, deletions };
}

/**
 * Marks the end of a copy of a parent's tree (call it once the copy is whole, before anything changes the copy):
 * resolves with the inode change time (ns) of a file written now, once the kernel's clock for those times has
 * moved past it, so that everything changed afterwards has a strictly later change time and everything the copy
 * wrote has one no later. `marker` is a scratch file path outside the tree; it is removed.
 */
export async function markCopyEnd(marker: string): Promise<bigint> {
  await writeFile(marker, "");
  const end = (await lstat(marker, { bigint: true })).ctimeNs;
  // The clock behind change times ticks coarsely (a few ms): wait for its next tick.
  for (;;) {
    await sleep(2);
    await writeFile(marker, "");
    if ((await lstat(marker, { bigint: true })).ctimeNs > end) break;
  }
  await rm(marker, { force: true });
  return end;
}

/**
 * Removes `path` (relative to `root`, as a layered copy's deletions name it) unless it leads out of `root`: no
 * absolute path, no `.` or `..`, and no symbolic link on the way (the link's target would be what goes).
 */
export async function removeInside(root: string, path: string): Promise<void> {
  const parts = path.split("/");
  if (path.startsWith("/") || parts.some((part) => part === "" || part === "." || part === "..")) {
    throw new Error(`a layered template in the store deletes '${path}', which is not a path inside its tree`);
  }
  let at = root;
  for (const part of parts.slice(0, -1)) {
    at = join(at, part);
    const st = await lstat(at).catch(() => undefined);
    // Gone already (a deleted directory's entry listed too), or not a real directory: nothing of the tree to remove.
    if (!st?.isDirectory()) return;
  }
  await rm(join(root, path), { recursive: true, force: true });
}
