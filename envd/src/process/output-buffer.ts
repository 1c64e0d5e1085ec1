/** Where a process's output came from. A process has either pipes (stdout, stderr) or a pty. */
export type OutputStream = "stdout" | "stderr" | "pty";

export interface OutputChunk {
  readonly stream: OutputStream;
  /** Offset of the chunk's first byte in the process's output. */
  readonly offset: number;
  readonly data: Buffer;
}

// A chunk is copied when it would otherwise pin a backing allocation this many times its size.
const MAX_SLACK_FACTOR = 4;
// Dropped slots are compacted away once there are this many.
const COMPACT_AFTER = 1024;

/**
 * The most recent output of one process, within a byte budget. Every byte has an offset in
 * one space shared by stdout, stderr and pty, counted from 0 in arrival order. Dropping old
 * bytes never renumbers the rest, so a client can name "everything after byte N" across
 * reconnects and tell from the offsets whether anything was lost.
 */
export class OutputBuffer {
  private chunks: OutputChunk[] = [];
  private head = 0;
  private retainedBytes = 0;
  private nextOffset = 0;

  constructor(private readonly capacityBytes: number) {}

  /** Offset of the oldest byte still held (equal to endOffset when nothing is held). */
  get startOffset(): number {
    return this.chunks[this.head]?.offset ?? this.nextOffset;
  }

  /** Offset the next byte of output will get: the number of bytes ever appended. */
  get endOffset(): number {
    return this.nextOffset;
  }

  /** Numbers `data` as the next bytes of output and keeps it (or its tail) if the budget allows. */
  append(stream: OutputStream, data: Buffer): OutputChunk {
    const chunk: OutputChunk = { stream, offset: this.nextOffset, data: compact(data) };
    this.nextOffset += data.length;
    if (this.capacityBytes > 0 && data.length > 0) {
      this.chunks.push(chunk);
      this.retainedBytes += data.length;
      this.trim();
    }
    return chunk;
  }

  /**
   * Held output from `offset` on (from the oldest held byte if `offset` was already dropped).
   * A chunk that straddles `offset` is cut so that no byte before it comes back.
   */
  readFrom(offset: number): OutputChunk[] {
    const from = Math.max(offset, this.startOffset);
    if (from >= this.nextOffset) return [];
    const index = this.indexOf(from);
    const result = this.chunks.slice(index);
    const first = result[0];
    if (first && first.offset < from) result[0] = cut(first, from - first.offset);
    return result;
  }

  /** Index of the held chunk containing byte `offset` (which must be held). */
  private indexOf(offset: number): number {
    let low = this.head;
    let high = this.chunks.length - 1;
    while (low < high) {
      const mid = (low + high + 1) >>> 1;
      if ((this.chunks[mid] as OutputChunk).offset <= offset) low = mid;
      else high = mid - 1;
    }
    return low;
  }

  private trim(): void {
    while (this.retainedBytes > this.capacityBytes) {
      const oldest = this.chunks[this.head] as OutputChunk;
      const excess = this.retainedBytes - this.capacityBytes;
      if (oldest.data.length <= excess) {
        this.head++;
        this.retainedBytes -= oldest.data.length;
      } else {
        this.chunks[this.head] = cut(oldest, excess);
        this.retainedBytes -= excess;
      }
    }
    if (this.head >= COMPACT_AFTER && this.head * 2 >= this.chunks.length) {
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
  }
}

function cut(chunk: OutputChunk, skip: number): OutputChunk {
  return { stream: chunk.stream, offset: chunk.offset + skip, data: chunk.data.subarray(skip) };
}

/** Small reads can be views into a large allocation; a held chunk should not pin all of it. */
function compact(data: Buffer): Buffer {
  return data.buffer.byteLength > data.length * MAX_SLACK_FACTOR ? Buffer.from(data) : data;
}
