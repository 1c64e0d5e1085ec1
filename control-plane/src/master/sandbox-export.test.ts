import { describe, expect, it } from "vitest";
import { ArchiveStart, exportPath } from "./sandbox-export.js";

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array) => Buffer.from(data).toString("utf8");

describe("ArchiveStart", () => {
  it("drops a login profile's output before the marker, also when the marker is split across chunks", () => {
    const start = new ArchiveStart(Buffer.from("MARK3R"));
    expect(text(start.feed(bytes("welcome to the sandbox\nMAR")))).toBe("");
    expect(start.started).toBe(false);
    expect(text(start.feed(bytes("K3Rtar-bytes")))).toBe("tar-bytes");
    expect(start.started).toBe(true);
    // After the marker everything passes, a second marker included.
    expect(text(start.feed(bytes("MARK3R more")))).toBe("MARK3R more");
  });

  it("refuses more than 64 KiB before the marker", () => {
    const start = new ArchiveStart(Buffer.from("MARK3R"));
    expect(() => start.feed(new Uint8Array(70 * 1024))).toThrow(/printed over 65536 bytes before the archive/);
  });
});

describe("exportPath", () => {
  it("normalizes absolute paths and refuses relative ones, NUL bytes and the root", () => {
    expect(exportPath("/home/user//out/")).toBe("/home/user/out");
    expect(exportPath("/tmp/x/../y")).toBe("/tmp/y");
    expect(() => exportPath("out")).toThrow(/must be absolute/);
    expect(() => exportPath("/a\0b")).toThrow(/NUL/);
    expect(() => exportPath("/")).toThrow(/whole sandbox/);
    expect(() => exportPath("/..")).toThrow(/whole sandbox/);
  });
});
