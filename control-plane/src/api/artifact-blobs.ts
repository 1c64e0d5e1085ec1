import { createHash, randomBytes } from "node:crypto";
import { createReadStream, type ReadStream } from "node:fs";
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { PassThrough, Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { extract } from "tar-stream";
import { ZipFile } from "yazl";

/** A finished archive in the staging folder, not yet an artifact. */
export interface StagedBlob {
  readonly file: string;
  readonly sizeBytes: number;
  readonly sha256: string;
}

const DIGEST = /^[0-9a-f]{64}$/;

/**
 * The artifacts' bytes: a content-addressed folder, `<dir>/sha256/<hex digest>`, written once through a staging
 * file in `<dir>/staging` (same filesystem, so the rename into place is atomic) and never changed after. Which blobs
 * are still referenced is PostgreSQL's business (store/artifacts.ts); this module only moves bytes.
 */
export class ArtifactBlobs {
  constructor(readonly dir: string) {}

  private blobPath(sha256: string): string {
    if (!DIGEST.test(sha256)) throw new Error(`'${sha256}' is not a sha256 digest`);
    return join(this.dir, "sha256", sha256);
  }

  private async stagingFile(suffix: string): Promise<string> {
    await mkdir(join(this.dir, "staging"), { recursive: true, mode: 0o700 });
    return join(this.dir, "staging", `${randomBytes(12).toString("hex")}.${suffix}`);
  }

  /** Writes `chunks` to a staging file, hashing as it goes. The file is removed when writing fails. */
  async stage(chunks: AsyncIterable<Uint8Array>, suffix: string): Promise<StagedBlob> {
    return this.writeStaged(await this.stagingFile(suffix), chunks);
  }

  private async writeStaged(file: string, chunks: AsyncIterable<Uint8Array>): Promise<StagedBlob> {
    // Opened here rather than by a path-based stream, which opens lazily: a failure early in the pipeline then
    // removed the file before that open created it, and the file outlived the failure (seen in CI).
    const handle = await open(file, "w", 0o600);
    const hash = createHash("sha256");
    let sizeBytes = 0;
    try {
      await pipeline(
        Readable.from(chunks, { objectMode: false }),
        async function* (source: AsyncIterable<Buffer>) {
          for await (const chunk of source) {
            hash.update(chunk);
            sizeBytes += chunk.byteLength;
            yield chunk;
          }
        },
        handle.createWriteStream(),
      );
    } catch (error) {
      await handle.close().catch(() => undefined);
      await this.discard(file);
      throw error;
    }
    return { file, sizeBytes, sha256: hash.digest("hex") };
  }

  /**
   * A zip with the same entries as a staged tar: files, folders and symbolic links (Info-ZIP's Unix modes, a link's
   * target as its content); other special files have no zip form and are left out. The tar stays staged.
   */
  async zipFromTar(tar: StagedBlob): Promise<StagedBlob> {
    const zip = new ZipFile();
    // The pipeline that writes the zip may not listen yet when a bad tar fails it; this keeps that failure from
    // being an uncaught stream error. The pipeline still sees it.
    zip.outputStream.on("error", () => undefined);
    const written = this.writeStaged(await this.stagingFile("zip"), zip.outputStream as AsyncIterable<Buffer>);
    try {
      const archive = extract();
      const reading = pipeline(createReadStream(tar.file), archive);
      // Awaited below; a failure while the loop is still reading surfaces through the loop instead.
      reading.catch(() => undefined);
      for await (const entry of archive) {
        const { name, type, mode = 0o644, mtime = new Date(0), linkname } = entry.header;
        const perm = mode & 0o7777;
        if (type === "directory") {
          zip.addEmptyDirectory(name, { mtime, mode: 0o040000 | perm });
        } else if (type === "symlink") {
          zip.addBuffer(Buffer.from(linkname ?? ""), name, { mtime, mode: 0o120000 | perm, compress: false });
        } else if (type === "file" || type === "contiguous-file") {
          const body = new PassThrough();
          zip.addReadStream(body, name, { mtime, mode: 0o100000 | perm, size: entry.header.size ?? 0 });
          await pipeline(entry, body);
          continue;
        }
        entry.resume();
      }
      await reading;
      zip.end();
    } catch (error) {
      (zip.outputStream as PassThrough).destroy(error as Error);
      await written.then(
        (staged) => this.discard(staged.file),
        () => undefined,
      );
      throw error;
    }
    return written;
  }

  /** Moves a staged file into the store as the blob of its digest (an identical blob there is simply replaced). */
  async commit(staged: StagedBlob): Promise<void> {
    await mkdir(join(this.dir, "sha256"), { recursive: true, mode: 0o700 });
    await rename(staged.file, this.blobPath(staged.sha256));
  }

  async discard(file: string): Promise<void> {
    await rm(file, { force: true });
  }

  /** The blob's bytes; undefined when it is not there (removed under the caller, or the folder was lost). */
  async open(sha256: string): Promise<{ stream: ReadStream; sizeBytes: number } | undefined> {
    // Opened before the stream exists: a path-based stream opens lazily, and a blob removed in between made it
    // emit ENOENT with no listener yet (an uncaught error, seen in the tests).
    const handle = await open(this.blobPath(sha256), "r").catch(() => undefined);
    if (!handle) return undefined;
    const info = await handle.stat();
    return { stream: handle.createReadStream(), sizeBytes: info.size };
  }

  /**
   * Removes staging files older than `olderThanMs`: what a publish left when its api died mid-way. Replicas share
   * the folder, so younger files may be another replica's publish in progress. Returns how many went.
   */
  async sweepStaging(olderThanMs: number, now = Date.now()): Promise<number> {
    const dir = join(this.dir, "staging");
    const names = await readdir(dir).catch(() => [] as string[]);
    let removed = 0;
    for (const name of names) {
      const info = await stat(join(dir, name)).catch(() => undefined);
      if (info && now - info.mtimeMs > olderThanMs) {
        await rm(join(dir, name), { force: true });
        removed++;
      }
    }
    return removed;
  }

  /** Removes a blob no artifact refers to any more (the caller checked, under the digest's lock). */
  async remove(sha256: string): Promise<void> {
    await rm(this.blobPath(sha256), { force: true });
  }
}
