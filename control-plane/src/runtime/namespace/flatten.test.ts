import { execFileSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { flattenLayers } from "./flatten.js";

// Whiteouts are character devices and opaque folders an xattr in the trusted namespace: root only (as CI runs).
const root = mkdtempSync(join(tmpdir(), "warren-flatten-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A rootfs and two layers over it, as overlayfs writes uppers: a whiteout, an opaque folder, changed modes. */
function stack(): { rootfs: string; layers: string[] } {
  const dir = mkdtempSync(join(root, "stack-"));
  const rootfs = join(dir, "rootfs");
  mkdirSync(join(rootfs, "etc/old"), { recursive: true });
  writeFileSync(join(rootfs, "etc/keep"), "from the rootfs\n");
  writeFileSync(join(rootfs, "etc/gone"), "deleted by the lower layer\n");
  writeFileSync(join(rootfs, "etc/old/a"), "hidden by an opaque folder\n");
  writeFileSync(join(rootfs, "etc/changed"), "rootfs version\n");
  const lower = join(dir, "layer-1");
  mkdirSync(join(lower, "etc"), { recursive: true });
  execFileSync("mknod", [join(lower, "etc/gone"), "c", "0", "0"]);
  writeFileSync(join(lower, "etc/changed"), "layer 1 version\n");
  writeFileSync(join(lower, "etc/tool"), "#!/bin/sh\n");
  chmodSync(join(lower, "etc/tool"), 0o4755);
  const upper = join(dir, "layer-2");
  mkdirSync(join(upper, "etc/old"), { recursive: true });
  execFileSync("setfattr", ["-n", "trusted.overlay.opaque", "-v", "y", join(upper, "etc/old")]);
  writeFileSync(join(upper, "etc/old/b"), "the opaque folder's only file\n");
  writeFileSync(join(upper, "etc/changed"), "layer 2 version\n");
  symlinkSync("/etc/keep", join(upper, "etc/link"));
  return { rootfs, layers: [upper, lower] };
}

describe("flattenLayers", () => {
  it("copies the tree a sandbox over the stack sees: whiteouts and opaque folders applied, modes and links kept", async () => {
    const { rootfs, layers } = stack();
    const dest = join(root, "flat");
    await flattenLayers(layers, rootfs, dest);
    expect(readFileSync(join(dest, "etc/keep"), "utf8")).toBe("from the rootfs\n");
    expect(existsSync(join(dest, "etc/gone"))).toBe(false);
    expect(readdirSync(join(dest, "etc/old"))).toEqual(["b"]);
    expect(readFileSync(join(dest, "etc/changed"), "utf8")).toBe("layer 2 version\n");
    expect(lstatSync(join(dest, "etc/tool")).mode & 0o7777).toBe(0o4755);
    expect(readlinkSync(join(dest, "etc/link"))).toBe("/etc/keep");
    // No overlayfs bookkeeping is copied, and the mount went with its namespace.
    expect(execFileSync("getfattr", ["-d", "-m", "-", join(dest, "etc/old")], { encoding: "utf8" })).toBe("");
    expect(readFileSync("/proc/self/mountinfo", "utf8")).not.toContain("warren-flatten");
    expect(readdirSync(root).filter((name) => name.startsWith(".flat"))).toEqual([]);
  });

  it("an empty stack is a copy of the rootfs; an existing destination or a missing layer fails and leaves nothing", async () => {
    const { rootfs, layers } = stack();
    const copy = join(root, "copy");
    await flattenLayers([], rootfs, copy);
    expect(readFileSync(join(copy, "etc/gone"), "utf8")).toBe("deleted by the lower layer\n");
    await expect(flattenLayers(layers, rootfs, copy)).rejects.toThrow(/already exists/);
    const broken = join(root, "broken");
    await expect(flattenLayers([join(root, "no-such-layer"), ...layers], rootfs, broken)).rejects.toThrow();
    expect(existsSync(broken)).toBe(false);
    expect(readdirSync(root).filter((name) => name.startsWith(".broken"))).toEqual([]);
  });
});
