import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { link, lstat, mkdir, readFile, rename, rm, unlink, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { promisify } from "node:util";
import { gunzip, gzip } from "node:zlib";
import { exec } from "../exec.js";
import { TAR_KEEP } from "../tar-stream.js";

/**
 * Incremental captures of an overlay upper dir. The first capture copies the whole dir; each later capture of the
 * same upper dir writes only what changed since the previous one, as a layer that goes directly ABOVE the previous
 * capture's layer (which stays in the stack). What a capture saw is kept in a manifest for the next one, so the
 * manifest belongs with the layer it describes: it must be kept (and dropped) with that layer.
 *
 * Paths are handled as latin1 strings end to end (find's output, tar's name lists, the manifest): one char per
 * byte, so names that are not UTF-8 survive.
 *
 * Figures (2 cores, tmpfs, 50,000 entries in 2,100 dirs, paths of ~60 bytes): `find -printf` lists them in
 * 170-230 ms, a node:fs walk (readdir + lstat bigint) in ~830 ms, hence find for the walk and node:fs only for the
 * dirs' birth times (~70 ms; find 4.9 prints none). The manifest is 4.8 MB as text, 0.3 MB gzipped at level 1 in
 * ~10 ms (this tree repeats itself; this host's /usr, 183k entries, gives 97 and 12 bytes an entry: ~0.6 MB for
 * 50k), read back in ~30 ms. A full capture takes 1.2 s (`cp -a` alone 1.18 s); a diff after changing 100 files
 * 0.44 s (242 entries, an 11 kB layer); one with nothing changed 0.36-0.5 s, mostly the walk.
 */

/** What a capture reports; a `full` layer holds the whole upper dir and must not be stacked above earlier ones. */
export interface UpperCapture {
  readonly kind: "full" | "diff";
  /** Entries written into the layer (files, dirs, links, whiteouts), not counting its root. */
  readonly entries: number;
  /** Bytes of regular file data copied. */
  readonly bytes: number;
}

export interface CaptureUpperOptions {
  /** The live overlay upper dir; the sandbox is frozen while the capture runs. */
  readonly upperDir: string;
  /** Where the new layer goes: must not exist yet. */
  readonly layerDir: string;
  /** Where this capture's manifest goes, for the next capture. */
  readonly manifestFile: string;
  /** The previous capture's manifest of the same upper dir; absent, unreadable or of another dir: full copy. */
  readonly previousManifestFile?: string;
}

/**
 * Kernel timestamps are coarse (a jiffy, 4–10 ms, on tmpfs and ext4 with 256-byte inodes, as sandbox disks are
 * made; a second on ext4 with small inodes): an entry changed in the same tick as the previous capture's walk
 * could keep the same ctime through a later change. A capture reads the filesystem's clock (UpperManifest.clockS)
 * and the next one copies again what changed within that tick. Manifests without it (older ones) use a window
 * around the capture's start instead: ten jiffies where they show sub-second times, two seconds where every time
 * they hold is a whole second.
 */
const CTIME_SAFETY_WINDOW_S = 0.1;
const COARSE_CTIME_SAFETY_WINDOW_S = 2;
const TOOL_ENV = { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", LANG: "C.UTF-8" };
const MANIFEST_FORMAT = "warren-upper-manifest/1";
/** find's `%y`: file, dir, symlink, char/block device, fifo, socket, door. */
const ENTRY_TYPES = new Set(["f", "d", "l", "c", "b", "p", "s", "D"]);

/** An entry of the upper dir as a manifest keeps it. Times stay the text find printed: compared, never computed. */
interface ManifestEntry {
  readonly type: string;
  readonly ino: string;
  /** `%C@`: seconds with a nanosecond fraction. */
  readonly ctime: string;
  /** Dirs only (`-` for others): birth time in ns, which tells a new dir from an old one on a reused inode. */
  readonly birth: string;
}

interface ScannedEntry extends ManifestEntry {
  readonly size: number;
}

interface UpperManifest {
  readonly upperDir: string;
  readonly startedAtMs: number;
  /**
   * The upper dir's filesystem clock when the capture started (the change time it gave a file made then, seconds):
   * an entry changed before that tick cannot change again unseen; one changed within it can.
   */
  readonly clockS?: number;
  /** Path relative to the upper dir ("" for itself) → entry, parents before their children. */
  readonly entries: ReadonlyMap<string, ManifestEntry>;
}

/**
 * Copies `upperDir` into a new layer at `layerDir`: only what changed since the previous capture (`diff`) when
 * `previousManifestFile` is that capture's manifest of this very upper dir, else all of it (`full`). Writes this
 * capture's manifest to `manifestFile` (through a temporary file next to it). On failure, removes what it wrote.
 */
export async function captureUpper(options: CaptureUpperOptions): Promise<UpperCapture> {
  const upperDir = resolve(options.upperDir);
  const layerDir = resolve(options.layerDir);
  const previous = options.previousManifestFile
    ? await readManifest(options.previousManifestFile, upperDir)
    : undefined;
  await mkdir(layerDir, { mode: 0o755 });
  const tmpManifest = `${options.manifestFile}.${randomBytes(4).toString("hex")}.tmp`;
  try {
    const startedAtMs = Date.now();
    const clockS = await filesystemClock(dirname(upperDir));
    const current = await scanUpper(upperDir);
    // A new root is a new upper dir (a fresh tmpfs, a copy back from elsewhere): nothing of the old one is there.
    const result =
      previous && sameInode(previous.entries.get(""), current.get(""))
        ? await writeDiff(upperDir, layerDir, previous, current)
        : await writeFull(upperDir, layerDir, current);
    await writeFile(tmpManifest, await encodeManifest({ upperDir, startedAtMs, clockS, entries: current }));
    await rename(tmpManifest, options.manifestFile);
    return result;
  } catch (error) {
    await rm(layerDir, { recursive: true, force: true });
    await rm(tmpManifest, { force: true });
    const reason = error instanceof Error ? error.message : String(error);
    throw new Error(`capturing upper dir '${upperDir}' into '${layerDir}' failed: ${reason}`, { cause: error });
  }
}

async function writeFull(upperDir: string, layerDir: string, current: ReadonlyMap<string, ScannedEntry>) {
  // `cp -a` keeps all a layer needs (as LayerStore always did); -T copies the dir's contents and its own metadata
  // onto the layer dir made above.
  await exec("cp", ["-a", "-T", "--", upperDir, layerDir]);
  let bytes = 0;
  for (const entry of current.values()) if (entry.type === "f") bytes += entry.size;
  return { kind: "full", entries: current.size - 1, bytes } as const;
}

/** What a diff layer holds, each list in walk order (parents first). */
interface DiffPlan {
  /** Copied whole, xattrs as they are. */
  readonly copied: string[];
  /** Dirs that were already there at the previous capture: copied for their own metadata only. */
  readonly structure: string[];
  /** Paths the previous capture had and the upper dir no longer has (the topmost of each removed subtree). */
  readonly whiteouts: string[];
  /** Copied dirs that replaced what the previous capture had at their path: marked opaque in the layer. */
  readonly opaqueDirs: string[];
  readonly bytes: number;
}

function planDiff(previous: UpperManifest, current: ReadonlyMap<string, ScannedEntry>): DiffPlan {
  const chosen = new Map<string, "copy" | "structure">([["", "structure"]]);
  // Dirs that are new at their path, or a new inode where the previous capture had something else: copied whole,
  // subtree included. One that replaced an earlier entry is marked opaque in the layer, which hides the previous
  // layer's version of its subtree at once: whiteouts inside it would not do, as overlayfs lists a dir that
  // nothing below merges with as it is, whiteouts included. The mark hides nothing the sandbox saw either: the
  // dir is opaque in the upper dir already when its lower layers had that path (overlayfs whiteouts a removed
  // path that a lower layer has, and a dir made over a whiteout is opaque), and otherwise nothing is under it.
  const complete = new Set<string>();
  const opaqueDirs: string[] = [];
  const includeParents = (path: string) => {
    for (let dir = parentOf(path); !chosen.has(dir); dir = parentOf(dir)) chosen.set(dir, "structure");
  };
  const wholeSeconds = [...previous.entries.values()].every((entry) => /^\d+(\.0*)?$/.test(entry.ctime));
  // Entries changed in the filesystem's tick at the previous capture (or after): a millisecond below it, as no
  // tick is shorter. Manifests from before the clock was kept fall back to a window around the capture's start.
  const windowStart =
    previous.clockS !== undefined
      ? previous.clockS - 0.001
      : previous.startedAtMs / 1000 - (wholeSeconds ? COARSE_CTIME_SAFETY_WINDOW_S : CTIME_SAFETY_WINDOW_S);
  for (const [path, now] of current) {
    if (path === "") continue;
    const before = previous.entries.get(path);
    let choice: "copy" | "structure" | undefined;
    const inComplete = complete.has(parentOf(path));
    if (inComplete || !sameInode(before, now)) {
      choice = "copy";
      if (now.type === "d") complete.add(path);
      if (now.type === "d" && before && !inComplete) opaqueDirs.push(path);
    } else if (before && (now.ctime !== before.ctime || Number(before.ctime) >= windowStart)) {
      // ctime moves with every change of data, metadata, xattrs and links, and userspace cannot set it back:
      // size and mtime would tell nothing more, and would make the manifest bigger.
      choice = now.type === "d" ? "structure" : "copy";
    }
    if (choice) {
      chosen.set(path, choice);
      includeParents(path);
    }
  }
  const whiteouts: string[] = [];
  for (const path of previous.entries.keys()) {
    if (path === "" || current.has(path)) continue;
    const parent = parentOf(path);
    // Under a removed dir, a dir replaced by a non-dir or an opaque dir, what is above already hides it.
    if (current.get(parent)?.type !== "d" || complete.has(parent)) continue;
    whiteouts.push(path);
    if (!chosen.has(parent)) chosen.set(parent, "structure");
    includeParents(parent);
  }
  const copied: string[] = [];
  const structure: string[] = [];
  let bytes = 0;
  for (const [path, entry] of current) {
    const choice = chosen.get(path);
    if (choice === "structure") structure.push(path);
    else if (choice === "copy" && entry.type === "s") {
      // tar skips sockets (`cp -a` makes them, but no process listens on one in a snapshot): hide what the
      // previous layer had there instead of letting it show through, unless an opaque dir does already.
      if (!complete.has(parentOf(path))) whiteouts.push(path);
    } else if (choice === "copy") {
      copied.push(path);
      if (entry.type === "f") bytes += entry.size;
    }
  }
  return { copied, structure, whiteouts, opaqueDirs, bytes };
}

async function writeDiff(
  upperDir: string,
  layerDir: string,
  previous: UpperManifest,
  current: ReadonlyMap<string, ScannedEntry>,
): Promise<UpperCapture> {
  const plan = planDiff(previous, current);
  // Whiteouts first and dir metadata last: tar sets each dir's mode and times after everything inside it is made.
  await makeWhiteouts(layerDir, plan.whiteouts);
  await tarCopy(upperDir, layerDir, plan.copied, []);
  await markOpaque(layerDir, plan.opaqueDirs);
  // A dir the previous layer has stays merged with it: an opaque mark here would hide the previous layer's
  // unchanged children. (If it was opaque then, the previous layer's copy still is, and hides what is below.)
  await tarCopy(upperDir, layerDir, plan.structure, [
    "--xattrs-exclude=trusted.overlay.opaque",
    "--xattrs-exclude=user.overlay.opaque",
  ]);
  const entries = plan.copied.length + plan.structure.length - 1 + plan.whiteouts.length;
  return { kind: "diff", entries, bytes: plan.bytes };
}

/** overlayfs whiteouts: 0:0 char devices, mode 0, owned by 0:0. One is made, the others are hard links to it,
 * as overlayfs itself does in upper dirs (node:fs has no mknod, and one process per whiteout is slow). */
async function makeWhiteouts(layerDir: string, paths: readonly string[]): Promise<void> {
  if (paths.length === 0) return;
  const source = `${layerDir}/.whiteout-${randomBytes(4).toString("hex")}`;
  const makeSource = () => exec("mknod", ["-m", "0", source, "c", "0", "0"]);
  await makeSource();
  try {
    for (const path of paths) {
      await mkdir(layerPath(layerDir, parentOf(path)), { recursive: true });
      const target = layerPath(layerDir, path);
      try {
        await link(source, target);
      } catch (error) {
        // ext4 caps an inode at 65,000 links: start another one.
        if ((error as NodeJS.ErrnoException).code !== "EMLINK") throw error;
        await unlink(source);
        await makeSource();
        await link(source, target);
      }
    }
  } finally {
    await rm(source, { force: true });
  }
}

/** Sets overlayfs' opaque mark on `dirs` of the layer: an xattr, which leaves the dirs' mtimes as tar set them. */
async function markOpaque(layerDir: string, dirs: readonly string[]): Promise<void> {
  if (dirs.length === 0) return;
  // xargs hands the names over as bytes (spawn's arguments would be UTF-8).
  const names = Buffer.from(`${dirs.map((p) => `./${p}`).join("\0")}\0`, "latin1");
  const child = spawn("xargs", ["-0", "setfattr", "-n", "trusted.overlay.opaque", "-v", "y", "--"], {
    cwd: layerDir,
    env: TOOL_ENV,
    stdio: ["pipe", "ignore", "pipe"],
  });
  child.stdin.on("error", () => undefined);
  child.stdin.end(names);
  const { code, stderr } = await exited(child);
  if (code !== 0) throw new Error(`marking dirs of '${layerDir}' opaque failed (${code}): ${stderr.trim()}`);
}

/** Copies `paths` (not what is under them) from `fromDir` into `toDir` with tar, keeping hard links among them. */
async function tarCopy(fromDir: string, toDir: string, paths: readonly string[], createFlags: readonly string[]) {
  if (paths.length === 0) return;
  const names = Buffer.from(`${paths.map((p) => (p === "" ? "." : `./${p}`)).join("\0")}\0`, "latin1");
  const create = spawn(
    "tar",
    [
      "--create",
      ...TAR_KEEP,
      ...createFlags,
      "--sparse",
      "--no-recursion",
      "--null",
      "--verbatim-files-from",
      "--no-unquote",
      "-C",
      fromDir,
      "--files-from=-",
    ],
    { env: TOOL_ENV, stdio: ["pipe", "pipe", "pipe"] },
  );
  // The archive goes straight from one tar to the other; this process drops its end of the pipe, so a failed
  // extract ends the create with SIGPIPE instead of leaving it blocked.
  const extract = spawn(
    "tar",
    ["--extract", ...TAR_KEEP, "--same-owner", "--same-permissions", "--delay-directory-restore", "-C", toDir],
    { env: TOOL_ENV, stdio: [create.stdout, "ignore", "pipe"] },
  );
  create.stdout.destroy();
  create.stdin.on("error", () => undefined); // A create that died early: its exit status says why.
  create.stdin.end(names);
  const [created, extracted] = await Promise.all([exited(create), exited(extract)]);
  if (created.code !== 0 || extracted.code !== 0) {
    const stderr = `${created.stderr}${extracted.stderr}`.trim().slice(-2000);
    throw new Error(`tar copy from '${fromDir}' to '${toDir}' failed (${created.code}/${extracted.code}): ${stderr}`);
  }
}

function exited(child: ChildProcess): Promise<{ code: number; stderr: string }> {
  return new Promise((done, fail) => {
    let stderr = "";
    child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
      stderr += chunk;
    });
    child.once("error", fail);
    child.once("close", (code, signal) => done({ code: code ?? (signal ? 128 : 1), stderr }));
  });
}

/** Every entry of the upper dir, parents first (find's pre-order). */
async function scanUpper(upperDir: string): Promise<Map<string, ScannedEntry>> {
  const listing = await runForOutput("find", [upperDir, "-printf", "%y %i %C@ %s %P\\0"]);
  const entries = new Map<string, ScannedEntry>();
  const dirs: string[] = [];
  for (const record of listing.toString("latin1").split("\0")) {
    if (record === "") continue;
    const fields = splitRecord(record, 4);
    if (!fields) throw new Error(`unexpected find output for '${upperDir}': '${record.slice(0, 200)}'`);
    const [type, ino, ctime, size, path] = fields;
    entries.set(path, { type, ino, ctime, birth: "-", size: Number(size) });
    if (type === "d") dirs.push(path);
  }
  // find prints no birth time (4.9 prints -1 where statx has one); node:fs reads it with statx.
  const BATCH = 32;
  for (let i = 0; i < dirs.length; i += BATCH) {
    await Promise.all(
      dirs.slice(i, i + BATCH).map(async (path) => {
        const stat = await lstat(layerPath(upperDir, path), { bigint: true });
        const entry = entries.get(path);
        if (entry) entries.set(path, { ...entry, birth: stat.birthtimeNs.toString() });
      }),
    );
  }
  return entries;
}

/**
 * The filesystem's current change time at `dir` (seconds): the ctime a file made there now gets, which is what the
 * kernel's coarse clock stamps on any change in this tick. `dir` is the upper dir's parent (the sandbox disk's
 * root): nothing made there shows in the sandbox.
 */
async function filesystemClock(dir: string): Promise<number> {
  const probe = join(dir, `.capture-clock-${randomBytes(4).toString("hex")}`);
  await writeFile(probe, "");
  try {
    const { ctimeNs } = await lstat(probe, { bigint: true });
    return Number(ctimeNs) / 1e9;
  } finally {
    await rm(probe, { force: true });
  }
}

/** The manifest: a JSON header line (UTF-8), then one `type ino ctime birth path` record per entry, NUL-ended
 * (latin1), gzipped. */
async function encodeManifest(manifest: UpperManifest): Promise<Buffer> {
  const header = JSON.stringify({
    format: MANIFEST_FORMAT,
    upperDir: manifest.upperDir,
    startedAtMs: manifest.startedAtMs,
    clockS: manifest.clockS,
  });
  const records: string[] = [];
  for (const [path, e] of manifest.entries) records.push(`${e.type} ${e.ino} ${e.ctime} ${e.birth} ${path}\0`);
  const text = Buffer.concat([Buffer.from(`${header}\n`, "utf8"), Buffer.from(records.join(""), "latin1")]);
  // Level 1: most of the gain (times and paths repeat) at a fraction of the default level's time.
  return promisify(gzip)(text, { level: 1 });
}

/** The previous capture's manifest, or undefined when it is missing, corrupt or of another upper dir. */
async function readManifest(file: string, upperDir: string): Promise<UpperManifest | undefined> {
  try {
    const text = await promisify(gunzip)(await readFile(file));
    const newline = text.indexOf(0x0a);
    const header = JSON.parse(text.subarray(0, newline).toString("utf8")) as Record<string, unknown>;
    if (header.format !== MANIFEST_FORMAT || header.upperDir !== upperDir) return undefined;
    if (typeof header.startedAtMs !== "number") return undefined;
    const entries = new Map<string, ManifestEntry>();
    const records = text
      .subarray(newline + 1)
      .toString("latin1")
      .split("\0");
    for (const record of records) {
      if (record === "") continue;
      const fields = splitRecord(record, 4);
      if (!fields || !ENTRY_TYPES.has(fields[0]) || !/^\d+$/.test(fields[1])) return undefined;
      const [type, ino, ctime, birth, path] = fields;
      entries.set(path, { type, ino, ctime, birth });
    }
    const clockS = typeof header.clockS === "number" ? { clockS: header.clockS } : {};
    return entries.has("") ? { upperDir, startedAtMs: header.startedAtMs, ...clockS, entries } : undefined;
  } catch {
    return undefined;
  }
}

/** `count` space-separated fields, then the rest of the record (a path, which may hold spaces). */
function splitRecord(record: string, count: number): [string, string, string, string, string] | undefined {
  const fields: string[] = [];
  let start = 0;
  for (let i = 0; i < count; i++) {
    const space = record.indexOf(" ", start);
    if (space < 0) return undefined;
    fields.push(record.slice(start, space));
    start = space + 1;
  }
  fields.push(record.slice(start));
  return fields as [string, string, string, string, string];
}

/** Same inode as before at this path: same type, inode number and (dirs) birth time. */
function sameInode(before: ManifestEntry | undefined, now: ManifestEntry | undefined): boolean {
  return (
    before !== undefined &&
    now !== undefined &&
    before.type === now.type &&
    before.ino === now.ino &&
    before.birth === now.birth
  );
}

function parentOf(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? "" : path.slice(0, slash);
}

/** `dir/path` as bytes: `path` is latin1 (one char per byte of the real name). */
function layerPath(dir: string, path: string): Buffer {
  return path === "" ? Buffer.from(dir) : Buffer.concat([Buffer.from(`${dir}/`), Buffer.from(path, "latin1")]);
}

/** Runs a tool and returns its raw stdout (exec decodes UTF-8, which would mangle names that are not). */
async function runForOutput(command: string, args: readonly string[]): Promise<Buffer> {
  const child = spawn(command, args, { env: TOOL_ENV, stdio: ["ignore", "pipe", "pipe"] });
  const chunks: Buffer[] = [];
  child.stdout.on("data", (chunk: Buffer) => chunks.push(chunk));
  const { code, stderr } = await exited(child);
  if (code !== 0) throw new Error(`${command} ${args[0] ?? ""} exited with ${code}: ${stderr.trim().slice(-2000)}`);
  return Buffer.concat(chunks);
}
