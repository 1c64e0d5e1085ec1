import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { mountPoints, unmountTree } from "./mounts.js";

// Real mounts (the tests run as root, like the node agent).
const root = mkdtempSync(join(tmpdir(), "warren-mounts-"));
// A failed test's mounts go too, before their directories.
afterAll(async () => {
  await unmountTree(root);
  rmSync(root, { recursive: true, force: true });
});

const under = async (dir: string) => (await mountPoints()).filter((p) => p === dir || p.startsWith(`${dir}/`));
const tmpfs = (point: string) => {
  mkdirSync(point, { recursive: true });
  execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "warren-test", point]);
};

describe("unmountTree", () => {
  it("unmounts nested mounts deepest first, and nothing outside the path", async () => {
    const dir = join(root, "nested");
    tmpfs(join(dir, "disk"));
    tmpfs(join(dir, "disk", "inner"));
    tmpfs(join(dir, "rootfs"));
    tmpfs(join(root, "nested-sibling"));
    expect(await under(dir)).toHaveLength(3);
    await unmountTree(dir);
    expect(await under(dir)).toEqual([]);
    expect(await under(join(root, "nested-sibling"))).toHaveLength(1);
    await unmountTree(join(root, "nested-sibling"));
    await unmountTree(join(root, "never-mounted"));
  });

  it("detaches a busy mount lazily after the plain unmount is refused", async () => {
    const dir = join(root, "busy");
    tmpfs(join(dir, "disk"));
    tmpfs(join(dir, "rootfs"));
    // A process whose working directory is on the mount keeps it busy.
    const holder = spawn("sleep", ["30"], { cwd: join(dir, "disk"), stdio: "ignore" });
    try {
      await unmountTree(dir);
      expect(await under(dir)).toEqual([]);
    } finally {
      holder.kill("SIGKILL");
    }
  });
});
