import { createHash, randomBytes } from "node:crypto";
import { once } from "node:events";
import { createWriteStream } from "node:fs";
import { type FileHandle, open, rm } from "node:fs/promises";
import { join } from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { contentChunks } from "./content-chunks.js";
import { AgentError } from "./errors.js";
import type { BlobRef, ImageConfig } from "./oci-store.js";
import type { PackCache } from "./pack-cache.js";

/**
 * A snapshot's own part (its memory, above all) as **packs**: the stream is cut into content-defined units
 * (content-chunks.ts, ~5 KiB: a sandbox's memory changes in scattered pages), and a publish writes one new pack
 * blob holding only the units its base (the same sandbox's previous publish) lacks, plus an index blob that lists
 * every unit in stream order as (pack, offset, size, sha256). The image's layers are the index and every pack it
 * names, so the store's collection keeps a base's packs while a later snapshot uses them. A paused sandbox
 * published again moves its changed units, not its memory; a pull assembles the stream from the units it lists
 * (a registry's packs fetched whole unless cached, a layout's read in place).
 * Few blobs per publish: a file or a registry request per unit would cost more than it saves (a registry took
 * ~8 ms per uploaded blob here, skopeo's cost per layer grows with the square of their count).
 *
 * When a base's packs hold more than twice what the new snapshot uses of them (its memory moved on), the publish
 * starts over without a base: one pack, nothing stale kept alive.
 */
export const PACK_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar";
export const MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json";
/** The config label that marks a packed own part (its first layer is the index). */
export const PACKED_LABEL = "dev.warren.packed";
/** What a pack's writer buffers before it waits for the disk. */
const WRITE_BUFFER_BYTES = 8 << 20;

/** Where packed images go: blobs by digest, a manifest under a tag. */
export interface PackStore {
  hasBlob(digest: string): Promise<boolean>;
  putBlob(digest: string, data: Buffer): Promise<void>;
  /** Stores a file of `size` bytes as a blob (moved into a layout, uploaded to a registry). */
  putBlobFile(digest: string, file: string, size: number): Promise<void>;
  /** Tags the manifest: called last, once every blob it names is there. */
  putManifest(tag: string, manifest: Buffer): Promise<void>;
  getManifest(tag: string): Promise<Buffer | undefined>;
  readBlob(digest: string): AsyncIterable<Buffer>;
  /** Where a pack is written before `putBlobFile` (a layout's own folder: the move is a rename). */
  readonly scratchDir: string;
  /** Makes `scratchDir` (and a layout) exist. */
  prepare(): Promise<void>;
  /** A blob's file, where the store is a directory on this node (read in place); absent for a registry. */
  localBlob?(digest: string): string;
}

export interface PackedManifest {
  readonly config: { readonly digest: string };
  readonly layers: readonly { readonly digest: string; readonly size: number; readonly mediaType: string }[];
}

/**
 * Units in stream order: [pack index, offset in the pack, size, id]. The id (the first 16 bytes of the unit's
 * sha256, base64url) only matches units against a base's; what a pull reads is checked by each pack's digest and
 * the whole stream's. The index is gzipped JSON (~30 bytes a unit: an index is ~0.6 % of what it describes).
 */
interface PackIndex {
  readonly packs: readonly string[];
  readonly units: readonly (readonly [number, number, number, string])[];
}

export interface PushedPacks {
  /** The whole stream's sha256 and size. */
  readonly ref: BlobRef;
  /** The new pack and the index: what this publish moved. */
  readonly uploadedBytes: number;
  readonly units: number;
  /** The base it was packed against (undefined: none, or it was dropped). */
  readonly base?: string;
}

/**
 * Sends `data()` to the store as a packed image tagged `tag`, against `base` (a packed image in the store) when
 * given; labels come from `labels` once the stream's digest is known. A failure leaves no tag (blobs already sent
 * stay for the next try or the store's collection).
 */
export async function pushPacked(
  store: PackStore,
  tag: string,
  data: () => AsyncIterable<Uint8Array>,
  labels: (ref: BlobRef) => Readonly<Record<string, string>>,
  base?: string,
  cache?: PackCache,
): Promise<PushedPacks> {
  await store.prepare();
  const baseIndex = base ? await readIndexOf(store, base).catch(() => undefined) : undefined;
  const packed = await packStream(store, data(), baseIndex);
  try {
    if (baseIndex && packed.stale) {
      await rm(packed.file, { force: true });
      return await pushPacked(store, tag, data, labels, undefined, cache);
    }
    let uploadedBytes = 0;
    if (packed.size > 0 && !(await store.hasBlob(packed.digest))) {
      // Kept first: a layout's putBlobFile moves the file away.
      await cache?.keep(packed.digest, packed.file);
      await store.putBlobFile(packed.digest, packed.file, packed.size);
      uploadedBytes += packed.size;
    }
    const packs = [...packed.packs];
    const index = gzipSync(JSON.stringify({ packs, units: packed.units } satisfies PackIndex));
    const indexDigest = digestOf(index);
    if (!(await store.hasBlob(indexDigest))) await store.putBlob(indexDigest, index);
    uploadedBytes += index.length;
    const packSizes = new Map([...(baseIndex?.sizes ?? []), [packed.digest, packed.size]]);
    const layers = [
      { mediaType: PACK_MEDIA_TYPE, digest: indexDigest, size: index.length },
      ...packs.map((digest) => ({ mediaType: PACK_MEDIA_TYPE, digest, size: packSizes.get(digest) ?? 0 })),
    ];
    const config = Buffer.from(
      JSON.stringify({
        architecture: "amd64",
        os: "linux",
        created: new Date().toISOString(),
        config: { Labels: { ...labels(packed.ref), [PACKED_LABEL]: "1" } },
        rootfs: { type: "layers", diff_ids: layers.map((layer) => layer.digest) },
      }),
    );
    const configDigest = digestOf(config);
    if (!(await store.hasBlob(configDigest))) await store.putBlob(configDigest, config);
    const manifest = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MANIFEST_MEDIA_TYPE,
        config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: configDigest, size: config.length },
        layers,
      }),
    );
    await store.putManifest(tag, manifest);
    return {
      ref: packed.ref,
      uploadedBytes,
      units: packed.units.length,
      ...(baseIndex && base ? { base } : {}),
    };
  } finally {
    await rm(packed.file, { force: true });
  }
}

interface BaseIndex {
  /** unit id → where it is. */
  readonly units: Map<string, { pack: string; offset: number; size: number }>;
  readonly sizes: Map<string, number>;
}

/** The units of a packed image in the store (undefined: not there, or not packed). */
async function readIndexOf(store: PackStore, tag: string): Promise<BaseIndex | undefined> {
  const manifest = await packedManifest(store, tag);
  const indexLayer = manifest?.layers[0];
  if (!manifest || !indexLayer) return undefined;
  const config = JSON.parse((await readWhole(store, manifest.config.digest, tag)).toString()) as ImageConfig;
  if (config.config?.Labels?.[PACKED_LABEL] !== "1") return undefined;
  const index = JSON.parse(gunzipSync(await readWhole(store, indexLayer.digest, tag)).toString()) as PackIndex;
  const units = new Map<string, { pack: string; offset: number; size: number }>();
  for (const [pack, offset, size, hex] of index.units) {
    const digest = index.packs[pack];
    if (digest !== undefined && !units.has(hex)) units.set(hex, { pack: digest, offset, size });
  }
  const sizes = new Map(manifest.layers.slice(1).map((layer) => [layer.digest, layer.size]));
  return { units, sizes };
}

/**
 * Cuts the stream into units and writes those `base` lacks (once each) into a new pack file. `stale`: the base's
 * packs it uses hold more than twice the bytes it uses of them.
 */
async function packStream(store: PackStore, data: AsyncIterable<Uint8Array>, base: BaseIndex | undefined) {
  const NEW = "";
  const file = join(store.scratchDir, `.pack-${randomBytes(6).toString("hex")}`);
  // Units are ~5 KiB: with the default 16 KiB of buffer every few units would wait for the disk; with this much,
  // cutting and hashing go on while the writes (gathered into one writev) land.
  const out = createWriteStream(file, { highWaterMark: WRITE_BUFFER_BYTES });
  const packHash = createHash("sha256");
  const whole = createHash("sha256");
  let wholeSize = 0;
  let size = 0;
  const known = new Map(base?.units ?? []);
  const used = new Map<string, number>();
  const order: string[] = [];
  const units: [string, number, number, string][] = [];
  try {
    const hashed = async function* () {
      for await (const piece of data) {
        whole.update(piece);
        wholeSize += piece.byteLength;
        yield piece;
      }
    };
    for await (const unit of contentChunks(hashed())) {
      const hex = createHash("sha256").update(unit).digest().subarray(0, 16).toString("base64url");
      let where = known.get(hex);
      if (!where) {
        where = { pack: NEW, offset: size, size: unit.length };
        known.set(hex, where);
        packHash.update(unit);
        size += unit.length;
        if (!out.write(unit)) await once(out, "drain");
      }
      if (!used.has(where.pack)) order.push(where.pack);
      used.set(where.pack, (used.get(where.pack) ?? 0) + where.size);
      units.push([where.pack, where.offset, where.size, hex]);
    }
  } catch (error) {
    // The export failed, or the disk filled: no half-written pack stays behind.
    out.end();
    await once(out, "close").catch(() => undefined);
    await rm(file, { force: true });
    throw error;
  }
  out.end();
  await once(out, "close");
  const digest = `sha256:${packHash.digest("hex")}`;
  const packs = order.map((pack) => (pack === NEW ? digest : pack));
  const position = new Map(packs.map((pack, i) => [pack, i]));
  let baseBytes = 0;
  let baseUsed = 0;
  for (const pack of order) {
    if (pack === NEW) continue;
    baseBytes += base?.sizes.get(pack) ?? 0;
    baseUsed += used.get(pack) ?? 0;
  }
  return {
    file,
    digest,
    size,
    packs,
    units: units.map(
      ([pack, offset, unitSize, hex]) =>
        [position.get(pack === NEW ? digest : pack) ?? 0, offset, unitSize, hex] as const,
    ),
    ref: { digest: `sha256:${whole.digest("hex")}`, size: wholeSize },
    stale: baseBytes > 2 * baseUsed + (1 << 20),
  };
}

export async function packedManifest(store: PackStore, tag: string): Promise<PackedManifest | undefined> {
  const bytes = await store.getManifest(tag);
  return bytes ? (JSON.parse(bytes.toString()) as PackedManifest) : undefined;
}

/**
 * An own part read as one stream, in order: `pieces` yields it (up to 1 MiB at a time: adjacent units are read
 * together) straight into its consumer, no copy on disk, and `finish` reads what a consumer left unread (tar stops
 * at the archive's end marker) and resolves with the whole part's sha256 and size, which the caller checks
 * against the published digest before the import counts.
 */
export interface PartReader {
  readonly config: ImageConfig;
  /** What was read from the store for it so far (a registry's packs at open, a layout's units as they are read). */
  readonly fetchedBytes: number;
  pieces(): AsyncIterable<Buffer>;
  finish(): Promise<BlobRef>;
  close(): Promise<void>;
}

/** Adjacent units are read in one go up to this size. */
const READ_RUN_BYTES = 1 << 20;

/** A read of `size` bytes at `offset` of the `file`-th open file. */
type Run = readonly [file: number, offset: number, size: number];

/** Reads runs of open files in order, hashing what it reads; the files are closed by `close`. */
class RunReader implements PartReader {
  private next = 0;
  private readonly whole = createHash("sha256");
  private size = 0;
  private fetched: number;
  private finished: BlobRef | undefined;

  constructor(
    readonly config: ImageConfig,
    private readonly handles: readonly FileHandle[],
    private readonly runs: readonly Run[],
    fetchedBytes: number,
    /** The files are the store's own (a layout's packs): what is read counts as fetched. */
    private readonly readsFetch: boolean,
    private readonly tag: string,
  ) {
    this.fetched = fetchedBytes;
  }

  get fetchedBytes(): number {
    return this.fetched;
  }

  private async read(): Promise<Buffer | undefined> {
    const run = this.runs[this.next];
    if (!run) return undefined;
    this.next++;
    const [file, offset, size] = run;
    const handle = this.handles[file];
    if (!handle) throw mismatch(this.tag);
    const piece = Buffer.allocUnsafe(size);
    const { bytesRead } = await handle.read(piece, 0, size, offset);
    if (bytesRead !== size) throw mismatch(this.tag);
    this.whole.update(piece);
    this.size += size;
    if (this.readsFetch) this.fetched += size;
    return piece;
  }

  async *pieces(): AsyncIterable<Buffer> {
    for (let piece = await this.read(); piece; piece = await this.read()) yield piece;
  }

  async finish(): Promise<BlobRef> {
    if (!this.finished) {
      while (await this.read());
      this.finished = { digest: `sha256:${this.whole.digest("hex")}`, size: this.size };
    }
    return this.finished;
  }

  async close(): Promise<void> {
    for (const handle of this.handles) await handle.close();
  }
}

/**
 * A whole file as a part (a one-layer part fetched by skopeo, or a layout's layer read in place), checked by the
 * caller; `fetchedBytes` absent: the file is the store's own, read in full.
 */
export async function fileReader(config: ImageConfig, file: string, fetchedBytes: number | undefined, tag: string) {
  const handle = await open(file, "r");
  const { size } = await handle.stat();
  const runs: Run[] = [];
  for (let offset = 0; offset < size; offset += READ_RUN_BYTES) {
    runs.push([0, offset, Math.min(READ_RUN_BYTES, size - offset)]);
  }
  return new RunReader(config, [handle], runs, fetchedBytes ?? size, false, tag);
}

/**
 * Opens the image tagged `tag` for reading as one stream: a packed own part (a registry's packs fetched whole into
 * `scratch` or taken from the node's cache, each checked against its digest; a layout's read in place, only the
 * units this part uses), or one of plain layers in order (an own part published before packs, in a layout
 * directory: copied into `scratch`, each layer checked). Once open, the part reads from open files: the store's
 * collection may remove a pack meanwhile.
 */
export async function openPacked(
  store: PackStore,
  tag: string,
  manifest: PackedManifest,
  scratch: string,
  cache?: PackCache,
): Promise<PartReader> {
  const config = JSON.parse((await readWhole(store, manifest.config.digest, tag)).toString()) as ImageConfig;
  if (config.config?.Labels?.[PACKED_LABEL] !== "1") {
    const file = join(scratch, "stream");
    let fetchedBytes = 0;
    const out = createWriteStream(file);
    try {
      for (const layer of manifest.layers) {
        const hash = createHash("sha256");
        for await (const piece of store.readBlob(layer.digest)) {
          hash.update(piece);
          fetchedBytes += piece.length;
          if (!out.write(piece)) await once(out, "drain");
        }
        if (`sha256:${hash.digest("hex")}` !== layer.digest) throw mismatch(tag);
      }
    } finally {
      out.end();
      await once(out, "close");
    }
    return fileReader(config, file, fetchedBytes, tag);
  }
  const indexLayer = manifest.layers[0];
  if (!indexLayer) throw mismatch(tag);
  const index = JSON.parse(gunzipSync(await readWhole(store, indexLayer.digest, tag)).toString()) as PackIndex;
  let fetchedBytes = indexLayer.size;
  const files: string[] = [];
  for (const [i, digest] of index.packs.entries()) {
    const local = store.localBlob?.(digest);
    if (local) {
      files.push(local);
      continue;
    }
    const packFile = join(scratch, `pack-${i}`);
    files.push(packFile);
    if (await cache?.take(digest, packFile)) continue;
    fetchedBytes += await copyChecked(store, digest, tag, packFile);
    await cache?.keep(digest, packFile);
  }
  const runs: [number, number, number][] = [];
  for (const [pack, offset, size] of index.units) {
    const last = runs.at(-1);
    if (last && last[0] === pack && last[1] + last[2] === offset && last[2] + size <= READ_RUN_BYTES) last[2] += size;
    else runs.push([pack, offset, size]);
  }
  const handles: FileHandle[] = [];
  try {
    for (const file of files) handles.push(await open(file, "r"));
  } catch (error) {
    for (const handle of handles) await handle.close();
    throw error;
  }
  return new RunReader(config, handles, runs, fetchedBytes, store.localBlob !== undefined, tag);
}

export function mismatch(tag: string, digest?: string): AgentError {
  return new AgentError(
    "failed_precondition",
    `'${tag}' in the store does not match the published ${digest ?? "digest"} (replaced or corrupted)`,
  );
}

function digestOf(data: Buffer): string {
  return `sha256:${createHash("sha256").update(data).digest("hex")}`;
}

async function readWhole(store: PackStore, digest: string, tag: string): Promise<Buffer> {
  const pieces: Buffer[] = [];
  for await (const piece of store.readBlob(digest)) pieces.push(piece);
  const data = Buffer.concat(pieces);
  if (digestOf(data) !== digest) throw mismatch(tag);
  return data;
}

/** A blob into a file, checked against its digest as it streams; resolves with its size. */
async function copyChecked(store: PackStore, digest: string, tag: string, file: string): Promise<number> {
  const hash = createHash("sha256");
  const out = createWriteStream(file);
  let size = 0;
  try {
    for await (const piece of store.readBlob(digest)) {
      hash.update(piece);
      size += piece.length;
      if (!out.write(piece)) await once(out, "drain");
    }
  } finally {
    out.end();
    await once(out, "close");
  }
  if (`sha256:${hash.digest("hex")}` !== digest) throw mismatch(tag);
  return size;
}
