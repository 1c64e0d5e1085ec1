import { chmod, lchown, lstat, readdir } from "node:fs/promises";
import { join } from "node:path";

/**
 * Moves a rootfs's owners into the sandbox user namespace's host range: uid/gid n (< 65536) becomes base + n, so
 * sandbox root owns what root owned, and the host sees only unprivileged ids. Ids already in the range stay
 * (a child template re-shifts only what its own steps created). chown clears setuid/setgid bits, so they are
 * put back (sudo must stay setuid).
 */
export async function shiftOwners(root: string, base: number): Promise<number> {
  let changed = 0;
  const visit = async (path: string): Promise<void> => {
    const st = await lstat(path);
    if (st.uid < 65536 || st.gid < 65536) {
      const uid = st.uid < 65536 ? st.uid + base : st.uid;
      const gid = st.gid < 65536 ? st.gid + base : st.gid;
      await lchown(path, uid, gid);
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
