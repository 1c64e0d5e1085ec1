import { Readable } from "node:stream";
import { extract } from "tar-stream";

/**
 * Reading an untrusted tar stream of plain files (what `tar --create --format=gnu` writes for a few regular files
 * with short names), with tar-stream: it verifies every header's checksum and the stream's framing (a truncated
 * stream, or one that goes on after the end of the archive, ends in an error). On top of it, anything but a regular
 * file with a name of one path component is refused (links, directories, devices, paths, long names). Nothing is
 * written anywhere: the caller decides what to do with each entry's bytes.
 */
export interface TarEntry {
  readonly name: string;
  readonly size: number;
  /** The whole body (for small entries). */
  read(): Promise<Buffer>;
  /** The body in chunks as they arrive. */
  body(): AsyncIterable<Buffer>;
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/;
const KINDS: Record<string, string> = {
  link: "a hard link",
  symlink: "a symbolic link",
  "character-device": "a character device",
  "block-device": "a block device",
  directory: "a directory",
  fifo: "a FIFO",
  "contiguous-file": "a contiguous file",
};

/**
 * Calls `onEntry` for each entry of the stream, in order (it may leave the body unread: it is skipped); resolves
 * with the stream's length in bytes. Throws on anything malformed, truncated or not a plain file, and whatever
 * `onEntry` throws; the source is closed (`return()`) when reading stops early.
 */
export async function readTar(
  data: AsyncIterable<Uint8Array>,
  onEntry: (entry: TarEntry) => Promise<void>,
): Promise<number> {
  let total = 0;
  const source = data[Symbol.asyncIterator]();
  const counted = Readable.from({
    [Symbol.asyncIterator]: () => ({
      next: async () => {
        const next = await source.next();
        if (!next.done) total += next.value.byteLength;
        return next;
      },
    }),
  });
  const archive = extract();
  counted.on("error", (error) => archive.destroy(error));
  counted.pipe(archive);
  try {
    for await (const stream of archive) {
      const { name, size = 0, type } = stream.header;
      if (type !== "file")
        throw new Error(`entry '${name}' is ${KINDS[type] ?? `of type '${type}'`}, not a regular file`);
      if (!NAME.test(name)) throw new Error(`entry '${name}' is not a plain file name`);
      const body = () => stream as AsyncIterable<Buffer>;
      await onEntry({
        name,
        size,
        body,
        read: async () => {
          const parts: Buffer[] = [];
          for await (const chunk of body()) parts.push(chunk);
          return Buffer.concat(parts);
        },
      });
      stream.resume();
    }
    return total;
  } catch (error) {
    if (error instanceof Error && /Unexpected end of data/.test(error.message)) {
      throw new Error("the stream ended early or goes on after the end of the archive");
    }
    if (error instanceof Error && /Invalid tar header/.test(error.message)) {
      throw new Error("a tar header is corrupt (not a tar stream, or damaged)");
    }
    throw error;
  } finally {
    counted.destroy();
    // What the source does on the way out (an exporter removing its files) is not this stream's failure.
    await source.return?.().catch(() => undefined);
  }
}
