import { createHash } from "node:crypto";
import { createReadStream, existsSync } from "node:fs";
import { copyFile, link, mkdir, open, rm, stat, statfs, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { withCurrentResourceNames } from "../driver.js";
import { exec } from "../exec.js";
import { tarCreateStream } from "../tar-stream.js";
import type { SandboxSnapshots, SnapshotMeta, VmIdentity } from "./snapshots.js";
import { readTar, type TarEntry } from "./tar-reader.js";

/**
 * Moving a sandbox snapshot between nodes (`exportSnapshot` → `importSnapshot`): one tar stream of
 *  - `meta.json`: the snapshot's meta (without `parent`), the stream's format, each file's size and SHA-256;
 *  - `disk.qcow2`: the snapshot's whole disk as one standalone qcow2 (`qemu-img convert` of its backing chain:
 *    the snapshot's layer, parent snapshots' layers, the template snapshot's disk, the template's root image).
 *    Another node's template disk is not the same bytes even for the same template (each boot writes to it, mkfs
 *    draws new UUIDs), and the guest's page cache in the memory file matches this node's disk exactly;
 *  - `memory.snap`, for a memory snapshot.
 * `meta.json` comes first, so an import refuses a snapshot this node cannot restore before receiving the rest.
 */
const FORMAT = "warren-microvm-snapshot/1";
const META = "meta.json";
const DISK = "disk.qcow2";
const MEMORY = "memory.snap";
const MiB = 2 ** 20;
/** The largest meta.json an import reads into memory. */
const META_MAX = MiB;
/** Room left on the snapshots' filesystem after an import (its instances' disk layers grow there too). */
const SPARE_BYTES = 256 * MiB;

interface FileDigest {
  readonly size: number;
  readonly sha256: string;
}

/** `meta.json` of a stream. */
interface StreamMeta extends Omit<SnapshotMeta, "parent"> {
  readonly format: typeof FORMAT;
  readonly files: Readonly<Record<string, FileDigest>>;
}

export interface SnapshotTransferOptions {
  readonly snapshots: SandboxSnapshots;
  /** This node's driver name (`microvm`, `microvm-tcg`): only snapshots of the same one are imported. */
  readonly driver: string;
  /** What this node would restore a memory snapshot with. */
  readonly identity: () => Promise<VmIdentity>;
  readonly log: Logger;
}

let qemuVersionOnce: Promise<string> | undefined;

/** `qemu-system-x86_64 --version` without its prefix, once per process. */
export function qemuVersion(): Promise<string> {
  if (!qemuVersionOnce) {
    qemuVersionOnce = exec("qemu-system-x86_64", ["--version"]).then((r) =>
      (r.stdout.split("\n")[0] ?? "").replace(/^QEMU emulator version /, "").trim(),
    );
    qemuVersionOnce.catch(() => {
      qemuVersionOnce = undefined;
    });
  }
  return qemuVersionOnce;
}

/** Why a memory snapshot made by `theirs` cannot be restored by `ours` (every part that differs), if it cannot. */
export function identityProblem(snapshotId: string, theirs: VmIdentity, ours: VmIdentity): string | undefined {
  const parts: [string, keyof VmIdentity][] = [
    ["QEMU", "qemu"],
    ["accelerator", "accel"],
    ["guest kernel", "kernel"],
    ["kernel command line", "cmdline"],
  ];
  const differ = parts
    .filter(([, key]) => theirs[key] !== ours[key])
    .map(([label, key]) => `${label} '${theirs[key]}' (this node: '${ours[key]}')`);
  if (differ.length === 0) return undefined;
  return `snapshot '${snapshotId}' holds a running guest this node cannot restore: made with ${differ.join(", ")}`;
}

export class SnapshotTransfer {
  constructor(private readonly options: SnapshotTransferOptions) {}

  /**
   * The snapshot as a tar stream. The standalone disk is made (and the memory file hard-linked) into a `.tmp-*`
   * directory before the first byte, which is removed when the stream ends, fails or its consumer stops early.
   */
  async *export(snapshotId: string): AsyncGenerator<Uint8Array> {
    const started = performance.now();
    const tmp = await this.stage(snapshotId);
    try {
      let bytes = 0;
      for await (const chunk of tarOf(tmp, snapshotId)) {
        bytes += chunk.byteLength;
        yield chunk;
      }
      this.options.log.info("sandbox snapshot exported", {
        snapshotId,
        bytes,
        ms: Math.round(performance.now() - started),
      });
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }

  /** The export's files in a new `.tmp-*` directory: meta.json, the standalone disk, the memory file. */
  private async stage(snapshotId: string): Promise<string> {
    const { snapshots } = this.options;
    const { meta, release } = await snapshots.hold(snapshotId);
    const tmp = snapshots.tmpDir(`export-${snapshotId}`);
    try {
      await mkdir(tmp, { recursive: true });
      // Zero clusters stay unallocated (qemu-img's default), so only data the guest can read is copied.
      await exec("qemu-img", ["convert", "-f", "qcow2", "-O", "qcow2", snapshots.disk(snapshotId), join(tmp, DISK)]);
      const names = [DISK];
      if (meta.memory) {
        // Written once, only ever unlinked: a link is a stable copy.
        await link(snapshots.memory(snapshotId), join(tmp, MEMORY)).catch(() =>
          copyFile(snapshots.memory(snapshotId), join(tmp, MEMORY)),
        );
        names.push(MEMORY);
      }
      const files: Record<string, FileDigest> = {};
      for (const name of names) files[name] = await digest(join(tmp, name));
      const { parent: _parent, ...kept } = meta;
      // A memory snapshot made before identities were recorded was made by this node's QEMU and kernel.
      const vm = meta.vm ?? (meta.memory ? await this.options.identity() : undefined);
      const streamMeta: StreamMeta = { ...kept, ...(vm ? { vm } : {}), format: FORMAT, files };
      await writeFile(join(tmp, META), JSON.stringify(streamMeta));
      return tmp;
    } catch (error) {
      await rm(tmp, { recursive: true, force: true });
      throw error;
    } finally {
      await release();
    }
  }

  /**
   * Stores a stream `export` made as snapshot `snapshotId`. Refuses, before receiving the files, a snapshot of
   * another driver, a memory snapshot made with another QEMU, accelerator, kernel or command line (what
   * `identityProblem` names) and one that would not fit on disk; then checks every file against its size and
   * digest, and the disk with qemu-img (qcow2, no backing file, no external data file, consistent). Built in a
   * `.tmp-*` directory renamed at the end: a refused or broken import leaves nothing. The template is checked
   * at create, as for a local snapshot (`startProblem`): the disk is standalone, this node needs none of the
   * template's images for it.
   */
  async import(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotMeta> {
    const { snapshots } = this.options;
    snapshots.checkNew(snapshotId);
    const started = performance.now();
    const tmp = snapshots.tmpDir(snapshotId);
    try {
      await mkdir(tmp, { recursive: true });
      const received: { meta?: StreamMeta } = {};
      const bytes = await readTar(data, async (entry) => {
        if (!received.meta) {
          if (entry.name !== META) throw new Error(`the stream starts with '${entry.name}', not '${META}'`);
          if (entry.size > META_MAX) throw new Error(`'${META}' is ${entry.size} bytes (at most ${META_MAX})`);
          received.meta = await this.admit(snapshotId, await entry.read(), tmp);
          return;
        }
        await receiveFile(entry, received.meta.files, tmp);
      });
      const { meta } = received;
      if (!meta) throw new Error("the stream holds no snapshot (an empty archive)");
      const missing = Object.keys(meta.files).filter((name) => !existsSync(join(tmp, name)));
      if (missing.length > 0) throw new Error(`the stream ended without ${missing.join(", ")}`);
      await checkDisk(join(tmp, DISK));
      const { format: _format, files: _files, snapshotId: _source, ...fields } = meta;
      const stored = await snapshots.publish(snapshotId, tmp, fields);
      this.options.log.info("sandbox snapshot imported", {
        snapshotId,
        bytes,
        sizeBytes: stored.sizeBytes,
        memory: stored.memory,
        ms: Math.round(performance.now() - started),
      });
      return stored;
    } catch (error) {
      await rm(tmp, { recursive: true, force: true });
      throw error;
    }
  }

  /** Parses meta.json and decides whether this node takes the snapshot. */
  private async admit(snapshotId: string, text: Buffer, tmp: string): Promise<StreamMeta> {
    const meta = parseStreamMeta(text);
    if (meta.driver !== this.options.driver) {
      throw new Error(
        `snapshot '${snapshotId}' was made by the '${meta.driver}' driver; this node runs '${this.options.driver}'`,
      );
    }
    if (meta.vm) {
      const problem = identityProblem(snapshotId, meta.vm, await this.options.identity());
      if (problem) throw new Error(problem);
    }
    const memory = meta.files[MEMORY];
    // The migration stream is the guest's RAM at most (zero pages take a few bytes) plus device state.
    const memoryMax = meta.resources.memoryMB * MiB * 1.05 + 64 * MiB;
    if (memory && memory.size > memoryMax) {
      throw new Error(`'${MEMORY}' is ${memory.size} bytes, more than a ${meta.resources.memoryMB} MiB guest's`);
    }
    const total = Object.values(meta.files).reduce((sum, f) => sum + f.size, 0);
    const fs = await statfs(tmp);
    const free = fs.bavail * fs.bsize;
    if (total + SPARE_BYTES > free) {
      throw new Error(`snapshot '${snapshotId}' needs ${mib(total)} MiB; ${mib(free)} MiB are free here`);
    }
    return meta;
  }
}

/** Reads an untrusted meta.json into a typed value, or throws naming what is wrong. */
function parseStreamMeta(text: Buffer): StreamMeta {
  let value: unknown;
  try {
    value = withCurrentResourceNames(JSON.parse(text.toString("utf8")));
  } catch {
    throw new Error(`'${META}' is not JSON`);
  }
  const m = value as Partial<Record<keyof StreamMeta, unknown>>;
  const fail = (what: string): never => {
    throw new Error(`'${META}' is not a snapshot's: ${what}`);
  };
  if (typeof m !== "object" || m === null) fail("not an object");
  if (m.format !== FORMAT) fail(`format ${JSON.stringify(m.format)}, expected '${FORMAT}'`);
  for (const key of ["snapshotId", "driver", "templateId", "templateHash", "sourceInstanceId"] as const) {
    if (typeof m[key] !== "string") fail(`'${key}' is not a string`);
  }
  if (typeof m.memory !== "boolean") fail("'memory' is not a boolean");
  if (!Number.isInteger(m.vcpus) || (m.vcpus as number) < 1) fail("'vcpus' is not a positive integer");
  if (typeof m.createdAt !== "number") fail("'createdAt' is not a number");
  const resources = m.resources as Record<string, unknown> | undefined;
  for (const key of ["cpuCount", "memoryMB", "diskSizeMB", "pidsMax"]) {
    const n = resources?.[key];
    if (typeof n !== "number" || !Number.isFinite(n) || n <= 0) fail(`'resources.${key}' is not a positive number`);
  }
  const vm = m.vm as Record<string, unknown> | undefined;
  if (m.memory && typeof vm !== "object") fail("a memory snapshot without 'vm'");
  if (vm !== undefined) {
    for (const key of ["qemu", "accel", "kernel", "cmdline"]) {
      if (typeof vm?.[key] !== "string") fail(`'vm.${key}' is not a string`);
    }
  }
  const files = m.files as Record<string, Partial<FileDigest>> | undefined;
  const expected = m.memory ? [DISK, MEMORY] : [DISK];
  const names = Object.keys(files ?? {});
  if (names.length !== expected.length || !expected.every((name) => names.includes(name))) {
    fail(`files ${JSON.stringify(names)}, expected ${JSON.stringify(expected)}`);
  }
  for (const [name, file] of Object.entries(files ?? {})) {
    if (!Number.isSafeInteger(file.size) || (file.size as number) < 0) fail(`'${name}' has no valid size`);
    if (typeof file.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(file.sha256)) fail(`'${name}' has no SHA-256`);
  }
  return m as StreamMeta;
}

/** Writes one announced file into `dir`, checking its size and digest. */
async function receiveFile(entry: TarEntry, files: StreamMeta["files"], dir: string): Promise<void> {
  const expected = Object.hasOwn(files, entry.name) ? files[entry.name] : undefined;
  if (!expected) throw new Error(`unexpected entry '${entry.name}' in the stream`);
  if (entry.size !== expected.size) {
    throw new Error(`'${entry.name}' is ${entry.size} bytes; meta.json announced ${expected.size}`);
  }
  // `wx`: a second entry of the same name fails instead of overwriting the first.
  const file = await open(join(dir, entry.name), "wx", 0o600).catch((error: NodeJS.ErrnoException) => {
    throw error.code === "EEXIST" ? new Error(`entry '${entry.name}' appears twice in the stream`) : error;
  });
  const hash = createHash("sha256");
  try {
    for await (const chunk of entry.body()) {
      hash.update(chunk);
      for (let at = 0; at < chunk.length; ) at += (await file.write(chunk, at)).bytesWritten;
    }
  } finally {
    await file.close();
  }
  if (hash.digest("hex") !== expected.sha256) {
    throw new Error(`'${entry.name}' does not match its SHA-256 in meta.json (corrupted in transit)`);
  }
}

/**
 * The received disk must be a standalone qcow2: no backing file and no external data file (either would make
 * QEMU open a path on this host that the sender chose), and consistent (`qemu-img check`). The header is read
 * before qemu-img opens it for the same reason.
 */
async function checkDisk(path: string): Promise<void> {
  const file = await open(path, "r");
  const header = Buffer.alloc(80);
  try {
    await file.read(header, 0, header.length, 0);
  } finally {
    await file.close();
  }
  if (header.readUInt32BE(0) !== 0x514649fb) throw new Error(`'${DISK}' is not a qcow2 image`);
  const version = header.readUInt32BE(4);
  if (header.readBigUInt64BE(8) !== 0n) throw new Error(`'${DISK}' has a backing file`);
  // qcow2 v3 incompatible feature bit 2: the guest data lives in an external file.
  if (version >= 3 && (header.readBigUInt64BE(72) & 4n) !== 0n) {
    throw new Error(`'${DISK}' has an external data file`);
  }
  const info: Record<string, unknown> = JSON.parse(
    (await exec("qemu-img", ["info", "-f", "qcow2", "--output=json", path])).stdout,
  );
  if (info.format !== "qcow2") throw new Error(`'${DISK}' is ${String(info.format)}, not qcow2`);
  if (info["backing-filename"] !== undefined) throw new Error(`'${DISK}' has a backing file`);
  const check = await exec("qemu-img", ["check", "-f", "qcow2", path], { allowFailure: true });
  if (check.code !== 0) {
    throw new Error(`'${DISK}' is not a consistent qcow2 image: ${(check.stdout + check.stderr).trim().slice(-300)}`);
  }
}

async function digest(path: string): Promise<FileDigest> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return { size: (await stat(path)).size, sha256: hash.digest("hex") };
}

/** `tar` of the staged files (tar-stream.ts: killed only if the consumer stops before its end). */
async function* tarOf(dir: string, snapshotId: string): AsyncGenerator<Uint8Array> {
  const names = [META, DISK, ...((await stat(join(dir, MEMORY)).catch(() => undefined)) ? [MEMORY] : [])];
  yield* tarCreateStream(
    ["--format=gnu", "--numeric-owner", "--owner=0", "--group=0", "--mode=0644", "-C", dir, "--", ...names],
    `snapshot '${snapshotId}'`,
  );
}

function mib(bytes: number): number {
  return Math.round(bytes / MiB);
}
