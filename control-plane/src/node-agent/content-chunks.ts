import { createHash } from "node:crypto";

/**
 * Content-defined chunking (a gear rolling hash, as in FastCDC): a cut falls where the hash of the last bytes
 * matches a mask, so the same content makes the same chunks wherever it sits in the stream. Two snapshots of one
 * sandbox (its memory dumped twice, a few pages changed) share every chunk but those around the changes, even when
 * a region grew and moved everything after it; fixed-size blocks would all shift. A publish against the previous
 * one moves only the chunks it lacks (snapshot-packs.ts).
 *
 * Written here rather than taken from npm: the maintained packages are WebAssembly builds with their own
 * parameters and streaming APIs; this is the 30-line loop the store needs, and its cut points are part of the
 * store's format (changing the table or the sizes changes every chunk, never the correctness).
 */
export const MIN_CHUNK = 1024;
/**
 * Cuts are tried once a chunk is MIN_CHUNK long; a 12-bit mask makes chunks ~5 KiB on average. Small, because a
 * sandbox's memory changes in scattered pages: between two pauses of an idle sandbox 1.0 MiB of its 17 MiB of
 * pages differed, which chunks of ~80 KiB spread over 9.3 MiB, of ~20 KiB over 4.6 MiB and of ~5 KiB over
 * 2.1 MiB (measured on its two dumps). The store keeps them in packs (snapshot-packs.ts), not a blob each.
 */
const MASK = 0xfff;
export const MAX_CHUNK = 16 * 1024;

/** 256 fixed pseudo-random 32-bit values (sha256 of each byte value): the same on every node, for ever. */
const GEAR = (() => {
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; i++) table[i] = createHash("sha256").update(`warren-gear-${i}`).digest().readUInt32LE(0);
  return table;
})();

/**
 * Splits a byte stream into content-defined chunks (MIN_CHUNK..MAX_CHUNK bytes, the last one shorter), yielded in
 * order: their concatenation is the stream.
 */
export async function* contentChunks(source: AsyncIterable<Uint8Array>): AsyncIterable<Buffer> {
  let pending: Buffer[] = [];
  let pendingLength = 0;
  let hash = 0;
  for await (const input of source) {
    const data = Buffer.isBuffer(input) ? input : Buffer.from(input.buffer, input.byteOffset, input.byteLength);
    let start = 0;
    while (start < data.length) {
      // Nothing cuts before MIN_CHUNK (the hash starts there: it only ever depends on the last 32 bytes).
      let i = start + Math.max(0, MIN_CHUNK - pendingLength);
      if (i >= data.length) break;
      if (pendingLength + (i - start) === MIN_CHUNK) hash = 0;
      const limit = Math.min(data.length, start + MAX_CHUNK - pendingLength);
      let cut = -1;
      while (i < limit) {
        hash = ((hash << 1) + (GEAR[data[i++] as number] as number)) | 0;
        if ((hash & MASK) === 0) {
          cut = i;
          break;
        }
      }
      if (cut < 0 && i === start + MAX_CHUNK - pendingLength) cut = i;
      if (cut < 0) break;
      pending.push(data.subarray(start, cut));
      yield pending.length === 1 ? (pending[0] as Buffer) : Buffer.concat(pending);
      pending = [];
      pendingLength = 0;
      start = cut;
    }
    if (start < data.length) {
      pending.push(data.subarray(start));
      pendingLength += data.length - start;
    }
  }
  if (pendingLength > 0) yield pending.length === 1 ? (pending[0] as Buffer) : Buffer.concat(pending);
}
