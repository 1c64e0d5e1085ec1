import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough, Readable } from "node:stream";
import { afterAll, describe, expect, it } from "vitest";
import { readVolumeFile, runVolumeOp } from "./volume-fs.js";

// The volume helper for real (python3, chrooted into a folder; the tests run as root, as the api does).
const root = mkdtempSync(join(tmpdir(), "warren-volfs-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const body = (text: string) => Readable.from([Buffer.from(text)]);

/** A client that sends some bytes, then goes away. */
function interrupted(text: string): Readable {
  return new Readable({
    read() {
      this.push(Buffer.from(text));
      setImmediate(() => this.destroy(new Error("aborted")));
    },
  });
}

async function read(path: string): Promise<string> {
  const out = new PassThrough();
  const chunks: Buffer[] = [];
  out.on("data", (c: Buffer) => chunks.push(c));
  await readVolumeFile(root, path, () => out);
  return Buffer.concat(chunks).toString();
}

describe("volume operations chrooted into the volume", () => {
  it("writes (exclusive without force, replacing with it), reads, and refuses with E2B's statuses", async () => {
    expect(await runVolumeOp(root, "write", "/a.txt", {}, body("one"))).toMatchObject({ size: 3, uid: 9090 });
    await expect(runVolumeOp(root, "write", "/a.txt", {}, body("two"))).rejects.toMatchObject({ status: 409 });
    await runVolumeOp(root, "write", "/a.txt", { force: true }, body("three"));
    expect(await read("/a.txt")).toBe("three");
    await expect(runVolumeOp(root, "write", "/no/dir/x", {}, body("x"))).rejects.toMatchObject({ status: 404 });
    await expect(read("/missing")).rejects.toMatchObject({ status: 404 });
  });

  it("an upload interrupted midway leaves the volume as it was: no new file, an existing one unchanged", async () => {
    await expect(runVolumeOp(root, "write", "/new.txt", {}, interrupted("partial"))).rejects.toMatchObject({
      status: 400,
    });
    await expect(runVolumeOp(root, "write", "/a.txt", { force: true }, interrupted("partial"))).rejects.toMatchObject({
      status: 400,
    });
    expect(await read("/a.txt")).toBe("three");
    expect(readdirSync(root).sort()).toEqual(["a.txt"]);
  });

  it("over the quota is a 507 and leaves nothing", async () => {
    await expect(runVolumeOp(root, "write", "/big", { quotaBytes: 10 }, body("x".repeat(100)))).rejects.toMatchObject({
      status: 507,
    });
    expect(readdirSync(root).sort()).toEqual(["a.txt"]);
  });

  it("a refusal midway through a large upload leaves the request whole and reads the rest of it (no reset)", async () => {
    // 16 MiB in 64 KiB chunks: the helper refuses long before the client is done sending.
    let sent = 0;
    const upload = new Readable({
      read() {
        if (sent >= 256) return void this.push(null);
        sent++;
        this.push(Buffer.alloc(64 * 1024, 1));
      },
    });
    await expect(runVolumeOp(root, "write", "/big", { quotaBytes: 1 << 20 }, upload)).rejects.toMatchObject({
      status: 507,
    });
    expect(upload.destroyed && !upload.readableEnded).toBe(false);
    await new Promise((resolve) => (upload.readableEnded ? resolve(undefined) : upload.once("end", resolve)));
    expect(sent).toBe(256);
    expect(readdirSync(root).sort()).toEqual(["a.txt"]);
  });

  it("a symlink to the host's root resolves inside the volume", async () => {
    symlinkSync("/", join(root, "up"));
    mkdirSync(join(root, "etc"));
    writeFileSync(join(root, "etc", "hostname"), "volume's own");
    expect(await read("/up/etc/hostname")).toBe("volume's own");
    await runVolumeOp(root, "write", "/up/etc/new", { force: true }, body("inside"));
    expect(readFileSync(join(root, "etc", "new"), "utf8")).toBe("inside");
  });
});
