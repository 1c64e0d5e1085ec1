import { createHash, randomBytes } from "node:crypto";
import { once } from "node:events";
import { createWriteStream } from "node:fs";
import { rm } from "node:fs/promises";
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
 * published again moves its changed units, not its memory; a pull streams the units it lists in order
 * (a registry's packs fetched whole unless cached, a layout's read in place: part-readers.ts).
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
export interface PackIndex {
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

export function mismatch(tag: string, digest?: string): AgentError {
  return new AgentError(
    "failed_precondition",
    `'${tag}' in the store does not match the published ${digest ?? "digest"} (replaced or corrupted)`,
  );
}

function digestOf(data: Buffer): string {
  return `sha256:${createHash("sha256").update(data).digest("hex")}`;
}

export async function readWhole(store: PackStore, digest: string, tag: string): Promise<Buffer> {
  const pieces: Buffer[] = [];
  for await (const piece of store.readBlob(digest)) pieces.push(piece);
  const data = Buffer.concat(pieces);
  if (digestOf(data) !== digest) throw mismatch(tag);
  return data;
}

/** A blob into a file, checked against its digest as it streams; resolves with its size. */
export async function copyChecked(store: PackStore, digest: string, tag: string, file: string): Promise<number> {
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
