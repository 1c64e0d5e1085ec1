import { createHash } from "node:crypto";
import { closeSync, existsSync, lstatSync, openSync, readFileSync, readlinkSync, readSync, statSync } from "node:fs";
import { isAbsolute, join, normalize, sep } from "node:path";
import { atCaller, TemplateError } from "./errors.js";
import { type GlobEntry, globEntries } from "./glob.js";

/**
 * The files of a COPY step, as E2B's SDK selects them (E2B-TEMPLATES.md §4.1), and their `filesHash` (§4.2).
 * The archive (archive.ts) holds exactly these entries.
 */

/** A file, directory or symlink a COPY takes from the context directory. */
export interface ContextEntry {
  readonly fullpath: string;
  /** Path relative to the context directory, `/`-separated; "" for the context directory itself. */
  readonly relativePath: string;
  readonly isDirectory: boolean;
  readonly isSymbolicLink: boolean;
}

/** Throws a TemplateError unless `src` is relative and stays inside the context directory. */
export function validateRelativePath(src: string, stackTrace?: string): void {
  if (isAbsolute(src)) {
    throw atCaller(
      new TemplateError(
        `Invalid source path "${src}": absolute paths are not allowed. Use a relative path within the context directory.`,
      ),
      stackTrace,
    );
  }
  const normalized = normalize(src);
  if (normalized === ".." || normalized.startsWith(`..${sep}`)) {
    throw atCaller(
      new TemplateError(
        `Invalid source path "${src}": path escapes the context directory. The path must stay within the context directory.`,
      ),
      stackTrace,
    );
  }
}

/** The patterns of `<context>/.dockerignore`: trimmed lines, without blanks and `#` comments (`!` is not special). */
export function readDockerignore(contextPath: string): string[] {
  const file = join(contextPath, ".dockerignore");
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line && !line.startsWith("#"));
}

function toEntry(e: GlobEntry): ContextEntry {
  return {
    fullpath: e.fullpath,
    relativePath: e.relative(),
    isDirectory: e.isDirectory(),
    isSymbolicLink: e.isSymbolicLink(),
  };
}

/**
 * The entries `src` selects in `contextPath`: each glob match, and for a matched directory everything below it
 * (`<dir>/**\/*`), deduplicated and sorted by absolute path (UTF-16 order).
 */
export function contextEntries(src: string, contextPath: string, ignorePatterns: readonly string[]): ContextEntry[] {
  const files = new Map<string, ContextEntry>();
  for (const match of globEntries(src, contextPath, ignorePatterns)) {
    files.set(match.fullpath, toEntry(match));
    if (!match.isDirectory()) continue;
    // E2B joins the directory's relative path into a pattern, so glob characters in its name stay magic.
    const below = join(match.relative() || ".", "**/*")
      .split(sep)
      .join("/");
    for (const e of globEntries(below, contextPath, ignorePatterns)) files.set(e.fullpath, toEntry(e));
  }
  return [...files.values()].sort((a, b) => (a.fullpath < b.fullpath ? -1 : a.fullpath > b.fullpath ? 1 : 0));
}

/** Whether a symlink is stored as the file or directory it points to (resolveSymlinks and a target that exists). */
export function followsLink(entry: ContextEntry, resolveSymlinks: boolean): boolean {
  if (!entry.isSymbolicLink || !resolveSymlinks) return false;
  const target = statSync(entry.fullpath, { throwIfNoEntry: false });
  return target !== undefined && (target.isFile() || target.isDirectory());
}

/**
 * `filesHash` of a COPY step: SHA-256 over `COPY <src> <dest>`, then per entry its relative path, mode, size and
 * (files) content or (symlinks kept as links) target text. Throws a plain Error when nothing matches, as E2B.
 */
export function calculateFilesHash(
  src: string,
  dest: string,
  contextPath: string,
  ignorePatterns: readonly string[],
  resolveSymlinks: boolean,
): string {
  const hash = createHash("sha256");
  hash.update(`COPY ${src} ${dest}`);
  const entries = contextEntries(src, contextPath, ignorePatterns);
  if (entries.length === 0) throw new Error(`No files found in ${join(contextPath, src)}`);
  for (const entry of entries) {
    hash.update(entry.relativePath);
    if (entry.isSymbolicLink && !followsLink(entry, resolveSymlinks)) {
      const st = lstatSync(entry.fullpath);
      hash.update(st.mode.toString());
      hash.update(st.size.toString());
      hash.update(readlinkSync(entry.fullpath));
      continue;
    }
    const st = statSync(entry.fullpath);
    hash.update(st.mode.toString());
    hash.update(st.size.toString());
    if (st.isFile()) hashFileContent(hash, entry.fullpath);
  }
  return hash.digest("hex");
}

function hashFileContent(hash: ReturnType<typeof createHash>, path: string): void {
  const fd = openSync(path, "r");
  try {
    const buffer = Buffer.allocUnsafe(1 << 20);
    for (;;) {
      const n = readSync(fd, buffer, 0, buffer.length, null);
      if (n === 0) break;
      hash.update(buffer.subarray(0, n));
    }
  } finally {
    closeSync(fd);
  }
}
