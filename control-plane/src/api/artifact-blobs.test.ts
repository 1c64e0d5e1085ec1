import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ArtifactBlobs } from "./artifact-blobs.js";

const root = mkdtempSync(join(tmpdir(), "warren-blobs-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

async function* chunksOf(data: Buffer, size = 1000): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < data.length; i += size) yield data.subarray(i, i + size);
}

/** A tar made by GNU tar of a folder with a nested file, an empty folder, an executable and an absolute symlink. */
function sampleTar(): Buffer {
  const src = join(root, "src");
  mkdirSync(join(src, "out/sub"), { recursive: true });
  mkdirSync(join(src, "out/empty"));
  writeFileSync(join(src, "out/sub/a.txt"), "alpha\n");
  writeFileSync(join(src, "out/run.sh"), "#!/bin/sh\necho hi\n", { mode: 0o755 });
  symlinkSync("/etc/hostname", join(src, "out/link"));
  return execFileSync("tar", ["-C", src, "-cf", "-", "out"]);
}

describe("ArtifactBlobs", () => {
  const blobs = new ArtifactBlobs(join(root, "store"));

  it("stages chunks with their sha256 and size, and commits them under the digest", async () => {
    const data = Buffer.from("x".repeat(2500));
    const staged = await blobs.stage(chunksOf(data), "tar");
    expect(staged.sizeBytes).toBe(2500);
    expect(staged.sha256).toBe(createHash("sha256").update(data).digest("hex"));
    await blobs.commit(staged);
    expect(readdirSync(join(root, "store/staging"))).toEqual([]);
    const opened = await blobs.open(staged.sha256);
    expect(opened?.sizeBytes).toBe(2500);
    opened?.stream.destroy();
    await blobs.remove(staged.sha256);
    expect(await blobs.open(staged.sha256)).toBeUndefined();
  });

  it("a failing source leaves no staging file", async () => {
    async function* failing(): AsyncGenerator<Uint8Array> {
      yield Buffer.from("partial");
      throw new Error("the master went away");
    }
    await expect(blobs.stage(failing(), "tar")).rejects.toThrow(/went away/);
    expect(readdirSync(join(root, "store/staging"))).toEqual([]);
  });

  it("turns a tar into a zip with the same files, folders, modes and symlinks", async () => {
    const tar = await blobs.stage(chunksOf(sampleTar()), "tar");
    const zip = await blobs.zipFromTar(tar);
    const file = join(root, "a.zip");
    writeFileSync(file, readFileSync(zip.file));
    await blobs.discard(tar.file);
    await blobs.discard(zip.file);
    expect(createHash("sha256").update(readFileSync(file)).digest("hex")).toBe(zip.sha256);
    expect(execFileSync("unzip", ["-p", file, "out/sub/a.txt"], { encoding: "utf8" })).toBe("alpha\n");
    // `unzip -Z` prints Unix modes: a link is `l…`, a folder `d…`, the script keeps its x bits.
    const listing = execFileSync("unzip", ["-Z", file], { encoding: "utf8" });
    expect(listing).toMatch(/^lrwxrwxrwx .* out\/link$/m);
    expect(listing).toMatch(/^drwx.* out\/empty\/$/m);
    expect(listing).toMatch(/^-rwxr-xr-x .* out\/run\.sh$/m);
    const out = join(root, "unzipped");
    execFileSync("unzip", ["-q", file, "-d", out]);
    expect(existsSync(join(out, "out/empty"))).toBe(true);
    expect(readdirSync(join(root, "store/staging"))).toEqual([]);
  });

  it("a corrupt tar fails the zip and leaves no zip behind", async () => {
    const tar = await blobs.stage(chunksOf(Buffer.from("this is not a tar archive at all".repeat(40))), "tar");
    await expect(blobs.zipFromTar(tar)).rejects.toThrow();
    await blobs.discard(tar.file);
    expect(readdirSync(join(root, "store/staging"))).toEqual([]);
  });

  it("sweeps only staging files older than the given age", async () => {
    const staging = join(root, "store/staging");
    writeFileSync(join(staging, "old.tar"), "left by a dead api");
    const old = new Date(Date.now() - 2 * 3600_000);
    utimesSync(join(staging, "old.tar"), old, old);
    writeFileSync(join(staging, "fresh.tar"), "a publish in progress");
    expect(await blobs.sweepStaging(3600_000)).toBe(1);
    expect(readdirSync(staging)).toEqual(["fresh.tar"]);
    rmSync(join(staging, "fresh.tar"));
  });
});
