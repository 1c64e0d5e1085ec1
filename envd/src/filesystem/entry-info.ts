import type { BigIntStats } from "node:fs";
import { lstat, realpath, stat } from "node:fs/promises";
import { basename } from "node:path";
import { create } from "@bufbuild/protobuf";
import { type Timestamp, TimestampSchema } from "@bufbuild/protobuf/wkt";
import { type EntryInfo, EntryInfoSchema, FileType } from "@warren/proto/filesystem/filesystem_pb";
import { fromFsError, notFound } from "../errors.js";
import type { UserDirectory } from "../users.js";
import { readMetadata } from "./metadata.js";

const S_IFMT = 0o170000;
const S_IFSOCK = 0o140000;
const S_IFLNK = 0o120000;
const S_IFREG = 0o100000;
const S_IFBLK = 0o060000;
const S_IFDIR = 0o040000;
const S_IFCHR = 0o020000;
const S_IFIFO = 0o010000;

/**
 * Go's os.FileMode.String() for a raw st_mode, which E2B clients show verbatim
 * (`-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`). Go writes one letter per set mode bit in
 * the order "dalTLDpSugct?" and then the nine permission bits, so /tmp is `dtrwxrwxrwx`
 * (not ls's `drwxrwxrwt`); a plain file has no letter and gets `-`.
 */
export function fileModeString(rawMode: number): string {
  const type = rawMode & S_IFMT;
  let letters = "";
  if (type === S_IFDIR) letters += "d";
  if (type === S_IFLNK) letters += "L";
  if (type === S_IFBLK || type === S_IFCHR) letters += "D";
  if (type === S_IFIFO) letters += "p";
  if (type === S_IFSOCK) letters += "S";
  if (rawMode & 0o4000) letters += "u";
  if (rawMode & 0o2000) letters += "g";
  if (type === S_IFCHR) letters += "c";
  if (rawMode & 0o1000) letters += "t";
  if (type !== S_IFDIR && type !== S_IFLNK && type !== S_IFREG && !letters) letters += "?";
  const rwx = "rwxrwxrwx";
  let perms = "";
  for (let bit = 0; bit < 9; bit++) perms += rawMode & (1 << (8 - bit)) ? rwx[bit] : "-";
  return (letters || "-") + perms;
}

function fileTypeOf(rawMode: number): FileType {
  switch (rawMode & S_IFMT) {
    case S_IFREG:
      return FileType.FILE;
    case S_IFDIR:
      return FileType.DIRECTORY;
    case S_IFLNK:
      return FileType.SYMLINK;
    default:
      return FileType.UNSPECIFIED;
  }
}

export function timestampOf(nanoseconds: bigint): Timestamp {
  return create(TimestampSchema, {
    seconds: nanoseconds / 1_000_000_000n,
    nanos: Number(nanoseconds % 1_000_000_000n),
  });
}

export function isSymlinkMode(rawMode: number): boolean {
  return (rawMode & S_IFMT) === S_IFLNK;
}

/**
 * Describes `path` the way E2B's envd does. The entry is named after the requested path,
 * not the resolved one; a symlink reports its target's type and permission bits (so SDK
 * code can treat a link to a directory as a directory) plus the absolute target, while
 * size, time, owner and `permissions` stay the link's own (lstat). A missing path is
 * `not_found`.
 */
export async function entryInfo(path: string, users: UserDirectory): Promise<EntryInfo> {
  let info: BigIntStats;
  try {
    info = await lstat(path, { bigint: true });
  } catch (error) {
    // "a/file.txt/x" does not exist either (so the SDK's exists() answers false).
    if ((error as NodeJS.ErrnoException).code === "ENOTDIR") throw notFound(`path '${path}' does not exist`);
    throw fromFsError(error, path);
  }
  return entryInfoFromStats(path, info, users);
}

export async function entryInfoFromStats(path: string, info: BigIntStats, users: UserDirectory): Promise<EntryInfo> {
  const rawMode = Number(info.mode);
  let type = fileTypeOf(rawMode);
  let mode = rawMode & 0o777;
  let symlinkTarget: string | undefined;
  if (isSymlinkMode(rawMode)) {
    // A dangling or looping link keeps its own path as target and an unknown type, as Go does.
    symlinkTarget = await realpath(path).catch(() => path);
    const target = await stat(symlinkTarget).catch(() => undefined);
    type = target ? fileTypeOf(target.mode) : FileType.UNSPECIFIED;
    mode = target ? target.mode & 0o777 : 0;
  }
  return create(EntryInfoSchema, {
    name: basename(path),
    type,
    path,
    size: info.size,
    mode,
    permissions: fileModeString(rawMode),
    owner: users.userName(Number(info.uid)),
    group: users.groupName(Number(info.gid)),
    modifiedTime: timestampOf(info.mtimeNs),
    symlinkTarget,
    metadata: await readMetadata(path),
  });
}
