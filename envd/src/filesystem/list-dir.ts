import type { BigIntStats } from "node:fs";
import { lstat, readdir, realpath, stat } from "node:fs/promises";
import { join } from "node:path";
import { type EntryInfo, FileType } from "@warren/proto/filesystem/filesystem_pb";
import { fromFsError, invalidArgument } from "../errors.js";
import type { UserDirectory } from "../users.js";
import { entryInfoFromStats } from "./entry-info.js";
import { type AccessChecker, mayAccess, READ, SEARCH } from "./permissions.js";

/** Entries of one directory are stat-ed this many at a time. */
const STAT_CONCURRENCY = 32;

interface Listed {
  entry: EntryInfo;
  stats: BigIntStats;
}

/** Go sorts directory entries by byte order of the names, which UTF-16 order does not match. */
function sortByBytes(names: string[]): string[] {
  return names
    .map((name) => ({ name, bytes: Buffer.from(name) }))
    .sort((a, b) => Buffer.compare(a.bytes, b.bytes))
    .map(({ name }) => name);
}

async function mapLimited<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await fn(items[index] as T);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

/**
 * E2B's ListDir: the path's own symlinks are followed, then a pre-order depth-first walk in
 * byte order of names, root excluded, `depth` levels deep (0 means 1). Entry paths are built
 * from the requested path, symlinked directories are listed but not descended, entries that
 * vanish mid-walk are skipped, and so are subdirectories the user may not list.
 */
export async function listDirectory(
  path: string,
  depth: number,
  access: AccessChecker,
  users: UserDirectory,
): Promise<EntryInfo[]> {
  const maxDepth = Math.max(depth, 1);
  await access.assertReachable(path);
  let resolved: string;
  try {
    resolved = await realpath(path);
  } catch (error) {
    throw fromFsError(error, path);
  }
  const info = await stat(resolved).catch((error: unknown) => {
    throw fromFsError(error, path);
  });
  if (!info.isDirectory()) throw invalidArgument(`path '${path}' is not a directory`);
  await access.assertListable(path);

  const entries: EntryInfo[] = [];
  const walk = async (dir: string, level: number): Promise<void> => {
    let names: string[];
    try {
      names = await readdir(dir);
    } catch (error) {
      if (level === 1) throw fromFsError(error, dir);
      return;
    }
    const listed = await mapLimited(sortByBytes(names), STAT_CONCURRENCY, (name) => describe(join(dir, name), users));
    for (const item of listed) {
      if (!item) continue;
      entries.push(item.entry);
      if (level < maxDepth && descendable(item, access)) await walk(item.entry.path, level + 1);
    }
  };
  await walk(path, 1);
  return entries;
}

async function describe(path: string, users: UserDirectory): Promise<Listed | undefined> {
  try {
    const stats = await lstat(path, { bigint: true });
    return { entry: await entryInfoFromStats(path, stats, users), stats };
  } catch {
    return undefined;
  }
}

function descendable({ entry, stats }: Listed, access: AccessChecker): boolean {
  if (entry.type !== FileType.DIRECTORY || entry.symlinkTarget !== undefined) return false;
  const inode = { mode: Number(stats.mode), uid: Number(stats.uid), gid: Number(stats.gid) };
  return mayAccess(access.user, inode, READ | SEARCH);
}
