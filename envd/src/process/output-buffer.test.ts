import { describe, expect, it } from "vitest";
import { OutputBuffer } from "./output-buffer.js";

const text = (chunks: { data: Buffer }[]) => Buffer.concat(chunks.map((c) => c.data)).toString();

describe("OutputBuffer", () => {
  it("numbers stdout, stderr and pty bytes in one offset space, in arrival order", () => {
    const buffer = new OutputBuffer(1024);
    expect(buffer.append("stdout", Buffer.from("abc")).offset).toBe(0);
    expect(buffer.append("stderr", Buffer.from("de")).offset).toBe(3);
    expect(buffer.append("stdout", Buffer.from("f")).offset).toBe(5);
    expect(buffer.endOffset).toBe(6);
    expect(buffer.readFrom(0).map((c) => [c.stream, c.offset, c.data.toString()])).toEqual([
      ["stdout", 0, "abc"],
      ["stderr", 3, "de"],
      ["stdout", 5, "f"],
    ]);
  });

  it("replays from an offset inside a chunk without repeating the bytes before it", () => {
    const buffer = new OutputBuffer(1024);
    buffer.append("stdout", Buffer.from("hello "));
    buffer.append("stdout", Buffer.from("world"));
    const replay = buffer.readFrom(3);
    expect(replay[0]?.offset).toBe(3);
    expect(text(replay)).toBe("lo world");
    expect(buffer.readFrom(6).map((c) => c.offset)).toEqual([6]);
    expect(buffer.readFrom(11)).toEqual([]);
  });

  it("drops the oldest bytes beyond its budget, keeping the offsets of the rest", () => {
    const buffer = new OutputBuffer(8);
    buffer.append("stdout", Buffer.from("0123"));
    buffer.append("stderr", Buffer.from("4567"));
    buffer.append("stdout", Buffer.from("89ab"));
    expect(buffer.startOffset).toBe(4);
    expect(buffer.endOffset).toBe(12);
    // An offset that was dropped replays from the oldest byte still held.
    expect(text(buffer.readFrom(0))).toBe("456789ab");
    buffer.append("stdout", Buffer.from("cdefghijkl"));
    expect(buffer.startOffset).toBe(14);
    expect(text(buffer.readFrom(0))).toBe("efghijkl");
    expect(buffer.readFrom(0)[0]?.offset).toBe(14);
  });

  it("with a zero budget still numbers output but holds none", () => {
    const buffer = new OutputBuffer(0);
    buffer.append("pty", Buffer.from("xyz"));
    expect(buffer.endOffset).toBe(3);
    expect(buffer.startOffset).toBe(3);
    expect(buffer.readFrom(0)).toEqual([]);
  });

  it("keeps every byte of many small chunks after compaction", () => {
    const buffer = new OutputBuffer(100);
    for (let i = 0; i < 5000; i++) buffer.append("stdout", Buffer.from(String(i % 10)));
    expect(buffer.startOffset).toBe(4900);
    const held = text(buffer.readFrom(4950));
    expect(held).toHaveLength(50);
    expect(held.startsWith("0123456789")).toBe(true);
  });
});
