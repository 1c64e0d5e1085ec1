import { chmod, chown, lstat, mkdir, rename, rm, stat } from "node:fs/promises";
import { dirname } from "node:path";
import type { EntryInfo } from "@warren/proto/filesystem/filesystem_pb";
import { alreadyExists, fromFsError, invalidArgument, notFound } from "../errors.js";
import type { SandboxUser, UserDirectory } from "../users.js";
import { entryInfo } from "./entry-info.js";
import type { AccessChecker } from "./permissions.js";

/** Mode of directories envd creates for a user (umask does not apply; it is set explicitly). */
export const DIRECTORY_MODE = 0o755;

function errnoOf(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException | undefined)?.code;
}

/** Every path from "/" down to `path` itself. */
function selfAndAncestors(path: string): string[] {
  const result = [path];
  for (let dir = dirname(path); dir !== result[0]; dir = dirname(dir)) result.unshift(dir);
  return result;
}

/**
 * Creates `dir` and any missing parents, each 0755 and owned by `user` (existing ones are
 * left alone). A non-directory on the way is `invalid_argument`.
 */
export async function ensureDirectory(dir: string, user: SandboxUser, access: AccessChecker): Promise<void> {
  let checked = false;
  for (const current of selfAndAncestors(dir)) {
    const info = await stat(current).catch((error: unknown) => {
      if (errnoOf(error) === "ENOENT") return undefined;
      throw fromFsError(error, current);
    });
    if (info) {
      if (!info.isDirectory()) throw invalidArgument(`path '${current}' exists but is not a directory`);
      continue;
    }
    if (!checked) {
      await access.assertCreatable(current);
      checked = true;
    }
    try {
      await mkdir(current, DIRECTORY_MODE);
    } catch (error) {
      // Someone else created it meanwhile; fine if it is a directory.
      if (errnoOf(error) === "EEXIST" && (await stat(current).catch(() => undefined))?.isDirectory()) continue;
      throw fromFsError(error, current);
    }
    try {
      await chown(current, user.uid, user.gid);
      await chmod(current, DIRECTORY_MODE);
    } catch (error) {
      throw fromFsError(error, current);
    }
  }
}

export async function statEntry(path: string, access: AccessChecker, users: UserDirectory): Promise<EntryInfo> {
  await access.assertReachable(path);
  return entryInfo(path, users);
}

/** E2B's MakeDir: an existing directory is `already_exists` (the SDK answers false), a file `invalid_argument`. */
export async function makeDirectory(
  path: string,
  user: SandboxUser,
  access: AccessChecker,
  users: UserDirectory,
): Promise<EntryInfo> {
  await access.assertReachable(path);
  const existing = await stat(path).catch(() => undefined);
  if (existing?.isDirectory()) throw alreadyExists(`directory '${path}' already exists`);
  if (existing) throw invalidArgument(`path '${path}' already exists but is not a directory`);
  await ensureDirectory(path, user, access);
  return entryInfo(path, users);
}

/** rename(2) with the destination's parents created for the user; returns the destination entry. */
export async function moveEntry(
  source: string,
  destination: string,
  user: SandboxUser,
  access: AccessChecker,
  users: UserDirectory,
): Promise<EntryInfo> {
  await access.assertReachable(source);
  const info = await lstat(source).catch((error: unknown) => {
    throw errnoOf(error) === "ENOENT" ? notFound(`path '${source}' does not exist`) : fromFsError(error, source);
  });
  await access.assertUnlinkable(source, info);
  const targetDir = dirname(destination);
  await ensureDirectory(targetDir, user, access);
  await access.assertCreatable(destination);
  if (await lstat(destination).catch(() => undefined)) await access.assertUnlinkable(destination);
  // Moving a directory to a new parent rewrites its "..", which needs write permission on it.
  if (info.isDirectory() && dirname(source) !== targetDir) await access.assertWritable(source);
  try {
    await rename(source, destination);
  } catch (error) {
    throw fromFsError(error, errnoOf(error) === "ENOENT" ? source : destination);
  }
  return entryInfo(destination, users);
}

/** `rm -rf`: recursive, and a missing path is not an error. */
export async function removeEntry(path: string, access: AccessChecker): Promise<void> {
  await access.assertRemovableTree(path);
  try {
    await rm(path, { recursive: true, force: true });
  } catch (error) {
    throw fromFsError(error, path);
  }
}
