import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readTar } from "./tar-reader.js";

const dir = mkdtempSync(join(tmpdir(), "warren-tar-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** GNU tar's archive of `names` in `dir`. */
function tar(names: readonly string[], ...options: string[]): Buffer {
  return execFileSync("tar", ["--create", "--format=gnu", ...options, "-C", dir, "--", ...names]);
}

async function* stream(pieces: readonly Buffer[]): AsyncGenerator<Uint8Array> {
  yield* pieces;
}

/** The entries' names and bodies, reading the stream in `chunk`-byte pieces. */
async function entries(data: Buffer, chunk = 1000): Promise<Record<string, string>> {
  const pieces: Buffer[] = [];
  for (let at = 0; at < data.length; at += chunk) pieces.push(data.subarray(at, at + chunk));
  const found: Record<string, string> = {};
  await readTar(stream(pieces), async (entry) => {
    found[entry.name] = (await entry.read()).toString();
  });
  return found;
}

function setChecksum(header: Buffer): void {
  header.fill(0x20, 148, 156);
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += header[i] ?? 0;
  header.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, "latin1");
}

writeFileSync(join(dir, "meta.json"), '{"a":1}');
writeFileSync(join(dir, "big.bin"), Buffer.alloc(70_000, 7));
mkdirSync(join(dir, "sub"));
writeFileSync(join(dir, "sub", "inner"), "x");
symlinkSync("/etc/hostname", join(dir, "link"));
writeFileSync(join(dir, "l".repeat(120)), "long");

describe("readTar", () => {
  it("reads regular files in order, whatever the chunking, and counts the stream's bytes", async () => {
    const data = tar(["meta.json", "big.bin"]);
    for (const chunk of [1, 511, 4096, data.length]) {
      const found = await entries(data, chunk);
      expect(found["meta.json"]).toBe('{"a":1}');
      expect(found["big.bin"]).toBe("\u0007".repeat(70_000));
    }
    await expect(readTar(stream([data]), async () => undefined)).resolves.toBe(data.length);
  });

  it("refuses links, directories, paths and GNU long names, naming the entry", async () => {
    await expect(entries(tar(["link"]))).rejects.toThrow("entry 'link' is a symbolic link, not a regular file");
    await expect(entries(tar(["sub"]))).rejects.toThrow("entry 'sub/' is a directory, not a regular file");
    await expect(entries(tar(["sub/inner"]))).rejects.toThrow("entry 'sub/inner' is not a plain file name");
    await expect(entries(tar(["l".repeat(120)]))).rejects.toThrow(
      `entry '${"l".repeat(120)}' is not a plain file name`,
    );
  });

  it("refuses a corrupt header, a truncated stream and data after the archive's end", async () => {
    const data = tar(["meta.json", "big.bin"]);
    const corrupt = Buffer.from(data);
    corrupt[3] = 0x41;
    await expect(entries(corrupt)).rejects.toThrow("a tar header is corrupt");
    const early = "the stream ended early or goes on after the end of the archive";
    await expect(entries(data.subarray(0, 1024 + 30_000))).rejects.toThrow(early);
    await expect(entries(data.subarray(0, 1024 + 512 * 137 + 100))).rejects.toThrow(early);
    await expect(entries(Buffer.concat([data, Buffer.from("more")]))).rejects.toThrow(early);
    await expect(entries(Buffer.from("not a tar at all".padEnd(600, "!")))).rejects.toThrow(/corrupt/);
  });

  it("reads a size in GNU's base-256 form (used from 8 GiB on)", async () => {
    const data = Buffer.from(tar(["meta.json"]));
    data.fill(0, 124, 136);
    data[124] = 0x80;
    data[135] = 7;
    setChecksum(data);
    expect(await entries(data)).toEqual({ "meta.json": '{"a":1}' });
  });

  it("stops reading the source when refusing (its generator is returned)", async () => {
    let closed = false;
    async function* source(): AsyncGenerator<Uint8Array> {
      try {
        yield tar(["link"]);
        yield Buffer.alloc(512);
      } finally {
        closed = true;
      }
    }
    await expect(readTar(source(), async () => undefined)).rejects.toThrow("symbolic link");
    expect(closed).toBe(true);
  });
});
