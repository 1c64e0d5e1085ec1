import { createHash } from "node:crypto";
import { once } from "node:events";
import { createWriteStream } from "node:fs";
import { contentChunks } from "./content-chunks.js";
import { AgentError } from "./errors.js";
import type { BlobRef, ImageConfig } from "./oci-store.js";

/**
 * Images whose layers are the content-defined chunks of one byte stream (content-chunks.ts): a snapshot's own part
 * (its memory, above all). Each chunk is a blob named by its sha256 and sent only when the store lacks it, so a
 * snapshot published again after a few changes (a sandbox paused twice, its memory dumped twice) moves only the
 * chunks around what changed. The store is a layout directory this node writes itself or a registry it talks to
 * (chunk-stores.ts); skopeo is not used here, because its cost per layer grows with the square of the layer count
 * (measured here: 100 layers 1.4 s, 400 layers 6 s, 1000 layers 34 s), where a blob is a file or a request.
 */
export const CHUNK_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar";
export const MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json";
/** The config label that marks an image of chunks (an own part pushed by skopeo as one layer has none). */
export const CHUNKED_LABEL = "dev.warren.chunked";

/** Where chunked images go: blobs by digest, a manifest under a tag. */
export interface ChunkStore {
  hasBlob(digest: string): Promise<boolean>;
  putBlob(digest: string, data: Buffer): Promise<void>;
  /** Tags the manifest: called last, once every blob it names is there. */
  putManifest(tag: string, manifest: Buffer): Promise<void>;
  getManifest(tag: string): Promise<Buffer | undefined>;
  readBlob(digest: string): AsyncIterable<Buffer>;
  /** How many blob transfers may overlap (a request each to a registry; a file write is not worth overlapping). */
  readonly parallel: number;
}

export interface ChunkedManifest {
  readonly config: { readonly digest: string };
  readonly layers: readonly { readonly digest: string; readonly size: number; readonly mediaType: string }[];
}

/** The image's manifest (not_found when the store does not have the tag). */
export async function chunkedManifest(store: ChunkStore, tag: string): Promise<ChunkedManifest> {
  const bytes = await store.getManifest(tag);
  if (!bytes) throw new AgentError("not_found", `'${tag}' is not in the store`);
  return JSON.parse(bytes.toString()) as ChunkedManifest;
}

export interface PushedChunks {
  /** The whole stream's sha256 and size. */
  readonly ref: BlobRef;
  /** Bytes of the chunks the store did not have. */
  readonly uploadedBytes: number;
  readonly chunks: number;
}

/**
 * Sends `data` to the store as an image tagged `tag` whose layers are its chunks, in order; the config's labels
 * come from `labels` once the whole stream's digest is known. A failure (a full disk, a registry gone) leaves no
 * tag: chunks already sent stay as whole blobs for the next try or the store's collection. Every transfer has ended
 * before this returns or throws.
 */
export async function pushChunked(
  store: ChunkStore,
  tag: string,
  data: AsyncIterable<Uint8Array>,
  labels: (ref: BlobRef) => Readonly<Record<string, string>>,
): Promise<PushedChunks> {
  const whole = createHash("sha256");
  let size = 0;
  const hashed = async function* () {
    for await (const piece of data) {
      whole.update(piece);
      size += piece.byteLength;
      yield piece;
    }
  };
  const layers: { mediaType: string; digest: string; size: number }[] = [];
  let uploadedBytes = 0;
  const sent = new Set<string>();
  await inParallel(store.parallel, async (run) => {
    for await (const chunk of contentChunks(hashed())) {
      const digest = `sha256:${createHash("sha256").update(chunk).digest("hex")}`;
      layers.push({ mediaType: CHUNK_MEDIA_TYPE, digest, size: chunk.length });
      // A chunk that appears twice in the stream (zero pages) is sent once.
      if (sent.has(digest)) continue;
      sent.add(digest);
      await run(async () => {
        if (await store.hasBlob(digest)) return;
        await store.putBlob(digest, chunk);
        uploadedBytes += chunk.length;
      });
    }
  });
  const ref = { digest: `sha256:${whole.digest("hex")}`, size };
  const config = Buffer.from(
    JSON.stringify({
      architecture: "amd64",
      os: "linux",
      created: new Date().toISOString(),
      config: { Labels: { ...labels(ref), [CHUNKED_LABEL]: "1" } },
      rootfs: { type: "layers", diff_ids: layers.map((layer) => layer.digest) },
    }),
  );
  const configDigest = `sha256:${createHash("sha256").update(config).digest("hex")}`;
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
  return { ref, uploadedBytes, chunks: layers.length };
}

/**
 * Reads the image tagged `tag` into `file` as one stream (its layers in order; in a layout directory also an own
 * part skopeo wrote as one layer before chunks), checking every blob against its digest. Resolves with its config
 * and the whole stream's digest and size, which the caller checks against the published digest.
 */
export async function readChunked(
  store: ChunkStore,
  tag: string,
  file: string,
  manifest: ChunkedManifest,
): Promise<{ config: ImageConfig; ref: BlobRef }> {
  const config = JSON.parse((await readWhole(store, manifest.config.digest, tag)).toString()) as ImageConfig;
  const whole = createHash("sha256");
  let size = 0;
  const out = createWriteStream(file);
  const write = async (piece: Buffer) => {
    whole.update(piece);
    size += piece.length;
    if (!out.write(piece)) await once(out, "drain");
  };
  try {
    if (store.parallel <= 1) {
      // One blob at a time, streamed (a layout's one-layer part may be large); a bad blob fails the read, and
      // the caller drops the file.
      for (const layer of manifest.layers) {
        const hash = createHash("sha256");
        for await (const piece of store.readBlob(layer.digest)) {
          hash.update(piece);
          await write(piece);
        }
        if (`sha256:${hash.digest("hex")}` !== layer.digest) throw mismatch(tag);
      }
    } else {
      // Chunks are fetched ahead (a registry's round trips overlap) and written in order.
      const ahead: Promise<Buffer[]>[] = [];
      const fetchAhead = (index: number) => {
        const layer = manifest.layers[index];
        if (!layer) return;
        const fetched = collect(store, layer.digest, tag);
        // Awaited in order below; one that fails while an earlier one is awaited must not go unhandled.
        fetched.catch(() => undefined);
        ahead.push(fetched);
      };
      for (let i = 0; i < store.parallel; i++) fetchAhead(i);
      for (let i = 0; i < manifest.layers.length; i++) {
        const pieces = await (ahead.shift() as Promise<Buffer[]>);
        fetchAhead(i + store.parallel);
        for (const piece of pieces) await write(piece);
      }
    }
  } finally {
    out.end();
    await once(out, "close");
  }
  return { config, ref: { digest: `sha256:${whole.digest("hex")}`, size } };
}

export function mismatch(tag: string, digest?: string): AgentError {
  return new AgentError(
    "failed_precondition",
    `'${tag}' in the store does not match the published ${digest ?? "digest"} (replaced or corrupted)`,
  );
}

/** A blob's pieces, checked against its digest. A layout's one-layer part is read in pieces, never whole. */
async function collect(store: ChunkStore, digest: string, tag: string): Promise<Buffer[]> {
  const hash = createHash("sha256");
  const pieces: Buffer[] = [];
  for await (const piece of store.readBlob(digest)) {
    hash.update(piece);
    pieces.push(piece);
  }
  if (`sha256:${hash.digest("hex")}` !== digest) throw mismatch(tag);
  return pieces;
}

async function readWhole(store: ChunkStore, digest: string, tag: string): Promise<Buffer> {
  return Buffer.concat(await collect(store, digest, tag));
}

/**
 * Runs the jobs `feed` hands to `run`, at most `limit` at a time; resolves once every job has ended, with the
 * first error if any (later jobs are not started after it).
 */
async function inParallel(limit: number, feed: (run: (job: () => Promise<void>) => Promise<void>) => Promise<void>) {
  const running = new Set<Promise<void>>();
  const state: { failure?: { error: unknown } } = {};
  const rethrow = () => {
    if (state.failure) throw state.failure.error;
  };
  const run = async (job: () => Promise<void>) => {
    rethrow();
    const started: Promise<void> = job()
      .catch((error: unknown) => {
        state.failure ??= { error };
      })
      .finally(() => running.delete(started));
    running.add(started);
    if (running.size >= limit) await Promise.race(running);
    rethrow();
  };
  try {
    await feed(run);
  } finally {
    await Promise.all(running);
  }
  rethrow();
}
