import type { Stats } from "node:fs";
import { lstat, readdir, realpath, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { permissionDenied } from "../errors.js";
import type { SandboxUser } from "../users.js";

export const READ = 4;
export const WRITE = 2;
export const SEARCH = 1;

const S_ISVTX = 0o1000;

/** What the kernel would decide for `user` on an inode: owner bits, else group bits, else other bits. */
export function mayAccess(user: SandboxUser, inode: Pick<Stats, "mode" | "uid" | "gid">, wanted: number): boolean {
  if (user.uid === 0) return true;
  let bits: number;
  if (inode.uid === user.uid) bits = (inode.mode >> 6) & 7;
  else if (user.groups.includes(inode.gid)) bits = (inode.mode >> 3) & 7;
  else bits = inode.mode & 7;
  return (bits & wanted) === wanted;
}

function isMissing(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  return code === "ENOENT" || code === "ENOTDIR" || code === "ELOOP" || code === "ENAMETOOLONG";
}

/** "/a/b/c" ⇒ ["/", "/a", "/a/b"]: the directories a lookup of the path walks through. */
export function ancestorsOf(path: string): string[] {
  const result: string[] = [];
  for (let dir = dirname(path); ; dir = dirname(dir)) {
    result.unshift(dir);
    if (dir === dirname(dir)) return result;
  }
}

/**
 * envd runs as root, so for reading, listing, watching and taking entries away it checks
 * for the request's user what the kernel would check for a process of theirs: search
 * permission on every directory a path goes through, read permission on the target, write
 * and search permission on the directory an entry is removed from or renamed out of (plus
 * the sticky-bit rule). Writes (uploads, compose, MakeDir, a Move's destination) are not checked:
 * E2B's envd makes them as root and hands the result to the user. Paths that do not exist
 * pass, so the operation itself reports `not_found` as it would for root. Denials are
 * `permission_denied` naming the path and what was missing.
 */
export class AccessChecker {
  constructor(readonly user: SandboxUser) {}

  get unrestricted(): boolean {
    return this.user.uid === 0;
  }

  /** Search permission on every existing directory on the way to `path`, symlinks included. */
  async assertReachable(path: string): Promise<void> {
    if (this.unrestricted) return;
    const lexical = ancestorsOf(path);
    await this.assertSearchable(lexical, path);
    // A symlinked ancestor makes the kernel walk the link's target too.
    const deepest = await this.deepestExisting(dirname(path));
    if (!deepest) return;
    const real = await realpath(deepest).catch(() => deepest);
    if (real !== deepest) await this.assertSearchable([...ancestorsOf(real), real], path);
  }

  async assertReadable(path: string): Promise<void> {
    await this.assertTarget(path, READ, "read");
  }

  async assertWritable(path: string): Promise<void> {
    await this.assertTarget(path, WRITE, "write");
  }

  /** Listing or watching a directory needs read and search permission on it. */
  async assertListable(dir: string): Promise<void> {
    await this.assertTarget(dir, READ | SEARCH, "list");
  }

  /** Unlinking or renaming `path` away: write+search on its directory, and the sticky-bit rule. */
  async assertUnlinkable(path: string, own?: Stats): Promise<void> {
    if (this.unrestricted) return;
    const parent = dirname(path);
    const parentInfo = await stat(parent).catch(() => undefined);
    if (!parentInfo) return;
    if (!mayAccess(this.user, parentInfo, WRITE | SEARCH)) throw this.denied(`remove entries from '${parent}'`, path);
    if (parentInfo.mode & S_ISVTX) {
      const info = own ?? (await lstat(path).catch(() => undefined));
      if (info && info.uid !== this.user.uid && parentInfo.uid !== this.user.uid) {
        throw this.denied(`remove '${path}' from sticky directory '${parent}'`, path);
      }
    }
  }

  /**
   * `rm -rf` as the user: unlinking the top entry, and for a real directory read, write and
   * search permission on it and on every directory below (so nothing is removed half-way).
   */
  async assertRemovableTree(path: string): Promise<void> {
    if (this.unrestricted) return;
    await this.assertReachable(path);
    const info = await lstat(path).catch(() => undefined);
    if (!info) return;
    await this.assertUnlinkable(path, info);
    if (info.isDirectory()) await this.assertEmptiable(path, info);
  }

  private async assertEmptiable(dir: string, info: Stats): Promise<void> {
    if (!mayAccess(this.user, info, READ | WRITE | SEARCH)) throw this.denied(`remove entries from '${dir}'`, dir);
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    const sticky = (info.mode & S_ISVTX) !== 0 && info.uid !== this.user.uid;
    for (const entry of entries) {
      // Only subdirectories (and entries of sticky directories) need their own inode.
      if (!entry.isDirectory() && !sticky) continue;
      const child = join(dir, entry.name);
      const childInfo = await lstat(child).catch(() => undefined);
      if (!childInfo) continue;
      if (sticky && childInfo.uid !== this.user.uid) {
        throw this.denied(`remove '${child}' from sticky directory '${dir}'`, child);
      }
      if (childInfo.isDirectory()) await this.assertEmptiable(child, childInfo);
    }
  }

  private async assertTarget(path: string, wanted: number, verb: string): Promise<void> {
    if (this.unrestricted) return;
    await this.assertReachable(path);
    const info = await stat(path).catch(() => undefined);
    if (info && !mayAccess(this.user, info, wanted)) throw this.denied(`${verb} '${path}'`, path);
  }

  private async assertSearchable(dirs: readonly string[], forPath: string): Promise<void> {
    for (const dir of dirs) {
      let info: Stats;
      try {
        info = await stat(dir);
      } catch (error) {
        if (isMissing(error)) return;
        throw error;
      }
      if (!info.isDirectory()) return;
      if (!mayAccess(this.user, info, SEARCH)) throw this.denied(`search '${dir}'`, forPath);
    }
  }

  private async deepestExisting(path: string): Promise<string | undefined> {
    for (let dir = path; ; dir = dirname(dir)) {
      try {
        await stat(dir);
        return dir;
      } catch (error) {
        if (!isMissing(error)) return undefined;
      }
      if (dir === dirname(dir)) return undefined;
    }
  }

  private denied(what: string, path: string) {
    const suffix = what.endsWith(`'${path}'`) ? "" : ` (needed for '${path}')`;
    return permissionDenied(`permission denied: user '${this.user.name}' may not ${what}${suffix}`);
  }
}
