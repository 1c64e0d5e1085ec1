import { createCipheriv, createHash, randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { contentChunks, MAX_CHUNK, MIN_CHUNK } from "./content-chunks.js";

async function* pieces(data: Buffer, sizes: () => number): AsyncIterable<Uint8Array> {
  for (let at = 0; at < data.length; ) {
    const size = Math.max(1, sizes());
    yield data.subarray(at, at + size);
    at += size;
  }
}

async function chunksOf(data: Buffer, sizes: () => number = () => 1 << 20): Promise<Buffer[]> {
  const out: Buffer[] = [];
  for await (const chunk of contentChunks(pieces(data, sizes))) out.push(Buffer.from(chunk));
  return out;
}

/**
 * Random-looking bytes that are the same on every run (AES-128-CTR of zeros under a key made from `seed`). How many
 * chunks a change touches depends on where cut points fall around it — with fresh random data a third chunk is
 * sometimes cut inside an inserted page — so the test that counts them must see the same bytes every time.
 */
function seededBytes(length: number, seed: string): Buffer {
  const key = createHash("sha256").update(seed).digest().subarray(0, 16);
  return createCipheriv("aes-128-ctr", key, Buffer.alloc(16)).update(Buffer.alloc(length));
}

const ids = (chunks: Buffer[]) => chunks.map((c) => createHash("sha256").update(c).digest("hex"));

describe("content-defined chunks", () => {
  it("concatenate to the stream, stay within their bounds, and do not depend on how the stream was split", async () => {
    const data = randomBytes(6 << 20);
    const whole = await chunksOf(data);
    expect(Buffer.concat(whole).equals(data)).toBe(true);
    for (const chunk of whole.slice(0, -1)) {
      expect(chunk.length).toBeGreaterThanOrEqual(MIN_CHUNK);
      expect(chunk.length).toBeLessThanOrEqual(MAX_CHUNK);
    }
    // Random read sizes (1 byte to 200 KiB): the same cut points.
    const ragged = await chunksOf(data, () => Math.floor(Math.random() * 200_000));
    expect(ids(ragged)).toEqual(ids(whole));
    // Zeros (no cut ever matches the mask): cut at MAX_CHUNK.
    const zeros = await chunksOf(Buffer.alloc(MAX_CHUNK * 3 + 5));
    expect(zeros.map((c) => c.length)).toEqual([MAX_CHUNK, MAX_CHUNK, MAX_CHUNK, 5]);
    expect(await chunksOf(Buffer.alloc(0))).toEqual([]);
  });

  it("share every chunk but those around a change, even after bytes were inserted before the rest", async () => {
    const data = seededBytes(8 << 20, "content-chunks: data");
    const before = new Set(ids(await chunksOf(data)));
    // A page inserted at a third (everything after it moves by 4 KiB) and 8 bytes changed at two thirds.
    const changed = Buffer.concat([
      data.subarray(0, 3 << 20),
      seededBytes(4096, "content-chunks: page"),
      data.subarray(3 << 20),
    ]);
    changed.writeBigUInt64LE(42n, 6 << 20);
    const after = await chunksOf(changed);
    const afterIds = ids(after);
    const fresh = after.filter((_chunk, i) => !before.has(afterIds[i] as string));
    const freshBytes = fresh.reduce((sum, chunk) => sum + chunk.length, 0);
    // Two changes, each in at most two chunks (a cut may fall inside the change).
    expect(fresh.length).toBeLessThanOrEqual(4);
    expect(freshBytes).toBeLessThan(4 * MAX_CHUNK);
    expect(freshBytes).toBeGreaterThan(4096);
  });
});
