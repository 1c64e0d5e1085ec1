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
 * Creates `dir` and any missing parents as root and hands each one it created to `user`
 * (0755, `user`:`user`); existing ones are left alone. As in E2B's envd (EnsureDirs) this
 * needs no permission of the user: envd writes on their behalf. A non-directory on the way
 * is `invalid_argument`.
 */
export async function ensureDirectory(dir: string, user: SandboxUser): Promise<void> {
  for (const current of selfAndAncestors(dir)) {
    const info = await stat(current).catch((error: unknown) => {
      if (errnoOf(error) === "ENOENT") return undefined;
      throw fromFsError(error, current);
    });
    if (info) {
      if (!info.isDirectory()) throw invalidArgument(`path '${current}' exists but is not a directory`);
      continue;
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

/**
 * E2B's MakeDir: the directory and its missing parents are created for the user wherever
 * root may create them (E2B checks no permission either); an existing directory is
 * `already_exists` (the SDK answers false), anything else there `invalid_argument`.
 */
export async function makeDirectory(path: string, user: SandboxUser, users: UserDirectory): Promise<EntryInfo> {
  const existing = await stat(path).catch((error: unknown) => {
    if (errnoOf(error) === "ENOENT") return undefined;
    throw fromFsError(error, path);
  });
  if (existing?.isDirectory()) throw alreadyExists(`directory '${path}' already exists`);
  if (existing) throw invalidArgument(`path '${path}' already exists but is not a directory`);
  await ensureDirectory(path, user);
  return entryInfo(path, users);
}

/**
 * rename(2), returning the destination entry. Taking the source away is checked like
 * Remove; the destination side is a write, done as in E2B's Move: its missing parents are
 * created for the user and whatever root may put there is allowed.
 */
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
  // Moving a directory to a new parent rewrites its "..", which needs write permission on it.
  if (info.isDirectory() && dirname(source) !== targetDir) await access.assertWritable(source);
  await ensureDirectory(targetDir, user);
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
