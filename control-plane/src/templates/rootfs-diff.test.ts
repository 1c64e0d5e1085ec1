import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { diffRootfs, markCopyEnd, removeInside } from "./rootfs-diff.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/** A parent tree, and a copy of it made as a child template's build makes it (cp -a), with its copy-end mark. */
async function parentAndCopy() {
  const dir = mkdtempSync(join(tmpdir(), "rootfs-diff-"));
  dirs.push(dir);
  const parent = join(dir, "parent");
  mkdirSync(join(parent, "a"), { recursive: true });
  mkdirSync(join(parent, "d", "deep"), { recursive: true });
  mkdirSync(join(parent, "quiet"));
  for (const [path, content] of [
    ["a/keep", "kept"],
    ["a/change", "before"],
    ["a/same-size", "aaaa"],
    ["a/gone", "bye"],
    ["d/deep/x", "x"],
    ["swap", "a file"],
    ["cap", "attributes only"],
    ["quiet/untouched", "u"],
  ] as const) {
    writeFileSync(join(parent, path), content);
  }
  symlinkSync("a/keep", join(parent, "link"));
  symlinkSync("a/keep", join(parent, "relink"));
  const child = join(dir, "child");
  execFileSync("cp", ["-a", parent, child]);
  const since = await markCopyEnd(join(dir, "copied"));
  return { parent, child, since };
}

describe("diffRootfs", () => {
  it("an unchanged copy differs in nothing", async () => {
    const { parent, child, since } = await parentAndCopy();
    expect(await diffRootfs(parent, child, since)).toEqual({ entries: [], deletions: [] });
  });

  it("lists what the build changed with its ancestors, and what it removed or replaced by another type", async () => {
    const { parent, child, since } = await parentAndCopy();
    writeFileSync(join(child, "a/change"), "after, longer");
    // Same size, and its modification time put back: the change time still tells.
    writeFileSync(join(child, "a/same-size"), "bbbb");
    utimesSync(join(child, "a/same-size"), new Date(0), new Date(0));
    writeFileSync(join(child, "a/new"), "new");
    rmSync(join(child, "a/gone"));
    rmSync(join(child, "d"), { recursive: true });
    rmSync(join(child, "swap"));
    mkdirSync(join(child, "swap"));
    writeFileSync(join(child, "swap/inner"), "in a directory now");
    chmodSync(join(child, "cap"), 0o644);
    rmSync(join(child, "relink"));
    symlinkSync("a/new", join(child, "relink"));
    mkdirSync(join(child, "fresh/er"), { recursive: true });

    const diff = await diffRootfs(parent, child, since);
    expect(diff.entries).toEqual([
      ".",
      "a",
      "a/change",
      "a/new",
      "a/same-size",
      "cap",
      "fresh",
      "fresh/er",
      "relink",
      "swap",
      "swap/inner",
    ]);
    expect([...diff.deletions].sort()).toEqual(["a/gone", "d", "swap"]);
  });

  it("markCopyEnd's time is later than what the copy wrote and earlier than what changes next", async () => {
    const { child, since } = await parentAndCopy();
    const { lstatSync } = await import("node:fs");
    expect(lstatSync(join(child, "quiet/untouched"), { bigint: true }).ctimeNs).toBeLessThanOrEqual(since);
    writeFileSync(join(child, "quiet/untouched"), "v");
    expect(lstatSync(join(child, "quiet/untouched"), { bigint: true }).ctimeNs).toBeGreaterThan(since);
  });
});

describe("removeInside", () => {
  it("removes inside the tree, and never outside it: no absolute path, no `..`, no symbolic link on the way", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rootfs-remove-"));
    dirs.push(dir);
    const root = join(dir, "root");
    const outside = join(dir, "outside");
    mkdirSync(join(root, "etc", "sub"), { recursive: true });
    mkdirSync(outside);
    writeFileSync(join(outside, "precious"), "keep");
    writeFileSync(join(root, "etc", "sub", "gone"), "x");
    symlinkSync(outside, join(root, "link"));

    await removeInside(root, "etc/sub");
    expect(existsSync(join(root, "etc", "sub"))).toBe(false);
    expect(existsSync(join(root, "etc"))).toBe(true);
    // Through a link: nothing goes (the link's target is not the tree's).
    await removeInside(root, "link/precious");
    expect(existsSync(join(outside, "precious"))).toBe(true);
    // The link itself is an entry of the tree.
    await removeInside(root, "link");
    expect(existsSync(join(root, "link"))).toBe(false);
    expect(existsSync(join(outside, "precious"))).toBe(true);
    for (const bad of ["../outside/precious", "/etc/passwd", "etc/../../outside", "", "etc//x", "./etc"]) {
      await expect(removeInside(root, bad)).rejects.toThrow(/not a path inside its tree/);
    }
    expect(existsSync(join(outside, "precious"))).toBe(true);
  });
});
