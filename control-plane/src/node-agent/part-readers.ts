import { createHash } from "node:crypto";
import { once } from "node:events";
import { createWriteStream } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { join } from "node:path";
import { gunzipSync } from "node:zlib";
import type { BlobRef, ImageConfig } from "./oci-store.js";
import type { PackCache } from "./pack-cache.js";
import {
  copyChecked,
  mismatch,
  PACKED_LABEL,
  type PackedManifest,
  type PackIndex,
  type PackStore,
  readWhole,
} from "./snapshot-packs.js";

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
