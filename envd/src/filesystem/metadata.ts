import { createRequire } from "node:module";
import { fromFsError, invalidArgument } from "../errors.js";

/** User metadata lives in extended attributes under this prefix (E2B's namespace). */
export const METADATA_XATTR_PREFIX = "user.e2b.";
/** Linux caps an xattr name at 255 bytes; the prefix takes 9 of them. */
export const MAX_METADATA_KEY_BYTES = 255 - METADATA_XATTR_PREFIX.length;
/** Keys plus values; one ext4 xattr block is 4 KiB, so more could not be stored anyway. */
export const MAX_METADATA_TOTAL_BYTES = 4096;

/** Validated metadata, in the order the client gave it. */
export type Metadata = ReadonlyArray<readonly [key: string, value: string]>;

const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;

type FsXattr = typeof import("fs-xattr");
let fsXattr: FsXattr | undefined;

/**
 * fs-xattr, a native addon (an ES module, required: envd's launcher runs its bundle as a script), loaded at the
 * first metadata call or by the warm-up: at start it took ~5 ms of every sandbox's CPU before envd listened.
 */
export function loadFsXattr(): FsXattr {
  fsXattr ??= createRequire(import.meta.url)("fs-xattr") as FsXattr;
  return fsXattr;
}

/**
 * Checks client metadata (from `X-Metadata-<key>` headers): keys are lower-cased as E2B
 * does, empty keys are dropped, the first of two equal keys wins, and keys and values must
 * be printable ASCII within the xattr limits.
 */
export function validateMetadata(pairs: Iterable<readonly [string, string]>): Metadata {
  const result: Array<[string, string]> = [];
  const seen = new Set<string>();
  let total = 0;
  for (const [rawKey, value] of pairs) {
    const key = rawKey.toLowerCase();
    if (key === "" || seen.has(key)) continue;
    if (!PRINTABLE_ASCII.test(key)) throw invalidArgument(`metadata key '${printable(key)}' must be printable ASCII`);
    if (key.length > MAX_METADATA_KEY_BYTES) {
      throw invalidArgument(`metadata key '${key.slice(0, 32)}...' is longer than ${MAX_METADATA_KEY_BYTES} bytes`);
    }
    if (!PRINTABLE_ASCII.test(value)) {
      throw invalidArgument(`metadata value for key '${key}' must be printable ASCII (0x20-0x7E)`);
    }
    total += key.length + value.length;
    if (total > MAX_METADATA_TOTAL_BYTES) {
      throw invalidArgument(`metadata is larger than ${MAX_METADATA_TOTAL_BYTES} bytes (keys plus values)`);
    }
    seen.add(key);
    result.push([key, value]);
  }
  return result;
}

function printable(text: string): string {
  return text.replace(/[^\x20-\x7e]/g, "?");
}

function errnoOf(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException | undefined)?.code;
}

/** The `user.e2b.*` attributes of `path` (symlinks followed), prefix stripped; none if unreadable. */
export async function readMetadata(path: string): Promise<Record<string, string>> {
  let names: string[];
  try {
    names = await loadFsXattr().listAttributes(path);
  } catch {
    // Dangling links, vanished files and filesystems without xattrs simply have no metadata.
    return {};
  }
  const pairs: Array<[string, string]> = [];
  for (const name of names) {
    if (!name.startsWith(METADATA_XATTR_PREFIX) || name.length === METADATA_XATTR_PREFIX.length) continue;
    try {
      const value = await loadFsXattr().getAttribute(path, name);
      pairs.push([name.slice(METADATA_XATTR_PREFIX.length), value.toString("utf8")]);
    } catch {
      // Removed between list and get.
    }
  }
  // fromEntries defines own properties, so a key like "__proto__" stays data.
  return Object.fromEntries(pairs);
}

/** Makes `metadata` the complete metadata of `path`: stale keys from earlier uploads go. */
export async function replaceMetadata(path: string, metadata: Metadata): Promise<void> {
  let existing: string[];
  try {
    existing = (await loadFsXattr().listAttributes(path)).filter((name) => name.startsWith(METADATA_XATTR_PREFIX));
  } catch (error) {
    if (errnoOf(error) === "ENOTSUP" && metadata.length === 0) return;
    throw metadataError(error, path);
  }
  const wanted = new Set(metadata.map(([key]) => METADATA_XATTR_PREFIX + key));
  try {
    for (const name of existing) {
      if (!wanted.has(name)) await loadFsXattr().removeAttribute(path, name).catch(ignoreNoData);
    }
    for (const [key, value] of metadata) await loadFsXattr().setAttribute(path, METADATA_XATTR_PREFIX + key, value);
  } catch (error) {
    throw metadataError(error, path);
  }
}

function ignoreNoData(error: unknown): void {
  if (errnoOf(error) !== "ENODATA") throw error;
}

function metadataError(error: unknown, path: string) {
  switch (errnoOf(error)) {
    case "ENOTSUP":
      return invalidArgument(`the filesystem of '${path}' does not support metadata (extended attributes)`);
    case "ENOSPC":
    case "E2BIG":
    case "ERANGE":
      return invalidArgument(`metadata for '${path}' does not fit in the file's extended attributes`);
    default:
      return fromFsError(error, path);
  }
}
