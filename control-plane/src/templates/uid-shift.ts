import { chmod, lchown, lstat, readdir } from "node:fs/promises";
import { join } from "node:path";

/** The ids of one sandbox user namespace: a node's range is [uid base, uid base + UID_RANGE). */
export const UID_RANGE = 65536;

/**
 * Moves owners from one sandbox uid range to another (a template pulled from a node whose uid base differs):
 * uid/gid in [from, from + 65536) becomes to + (id - from); anything else stays.
 */
export function rebaseOwners(root: string, from: number, to: number): Promise<number> {
  return remapOwners(root, (id) => (id >= from && id < from + UID_RANGE ? id - from + to : undefined));
}

/**
 * Rewrites every entry's uid and gid that `map` maps (undefined: unchanged). chown clears setuid/setgid bits, so
 * they are put back (sudo must stay setuid).
 */
async function remapOwners(root: string, map: (id: number) => number | undefined): Promise<number> {
  let changed = 0;
  const visit = async (path: string): Promise<void> => {
    const st = await lstat(path);
    const uid = map(st.uid);
    const gid = map(st.gid);
    if (uid !== undefined || gid !== undefined) {
      await lchown(path, uid ?? st.uid, gid ?? st.gid);
      if (!st.isSymbolicLink() && st.mode & 0o6000) await chmod(path, st.mode & 0o7777);
      changed++;
    }
    if (st.isDirectory()) {
      const entries = await readdir(path);
      for (let i = 0; i < entries.length; i += 32) {
        await Promise.all(entries.slice(i, i + 32).map((name) => visit(join(path, name))));
      }
    }
  };
  await visit(root);
  return changed;
}
