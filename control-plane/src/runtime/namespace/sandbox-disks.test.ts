import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { silentLogger } from "@warren/platform/log";
import { afterAll, describe, expect, it } from "vitest";
import { MAKE_DISK, SandboxDisks } from "./sandbox-disks.js";

// Real mkfs, loop devices and mounts (the tests run as root, like the node agent).
const root = mkdtempSync(join(tmpdir(), "warren-disks-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const mountsUnder = (dir: string) =>
  readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((line) => line.split(" ")[4] ?? "")
    .filter((point) => point.startsWith(`${dir}/`));

/** Runs the launcher's disk part (instance-container.ts MOUNT_ROOT) for an instance directory. */
function mountDisk(instanceDir: string, env: Readonly<Record<string, string>>): void {
  const script = `set -e
D="$1"
mkdir -p "$D/disk"
if [ -n "$DISK_READY" ]; then
  mount --move "$DISK_READY" "$D/disk"
else
  IMG="$D/disk.img"
  MNT="$D/disk"
${MAKE_DISK}fi`;
  const run = spawnSync("sh", ["-c", script, "launcher", instanceDir], {
    env: { ...process.env, ...env, UID_BASE: "100000" },
  });
  expect(run.stderr.toString()).toBe("");
  expect(run.status).toBe(0);
}

// envd's static launcher as the build makes it (it makes a disk in one exec), and the tools themselves.
const LAUNCHER = fileURLToPath(new URL("../../../../envd/dist/warren-exec", import.meta.url));

describe.each([
  { made: "by warren-exec --ready-disk", launcher: LAUNCHER },
  { made: "by cp, losetup and mount", launcher: undefined },
])("SandboxDisks, disks made $made", ({ launcher }) => {
  it("the probe picks ext4 images where loop devices work; creates get ready disks; full is ENOSPC; close unmounts", async () => {
    const base = join(root, launcher ? "made-by-launcher" : "made-by-tools");
    const dir = join(base, "disks");
    // A formatted image of an earlier Warren (no layer dirs in it) is not used: the probe removes it.
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "ext4-64m.img"), "");
    const disks = new SandboxDisks(dir, 100000, silentLogger, launcher);
    await disks.probe();
    expect(existsSync(join(dir, "ext4-64m.img"))).toBe(false);
    // What this host has decides: loop devices (and root) give images, else tmpfs.
    expect(disks.kind).toBe(existsSync("/dev/loop-control") ? "image" : "tmpfs");
    if (disks.kind === "tmpfs") {
      expect(await disks.forInstance(join(base, "i0"), 64)).toEqual({});
      return;
    }

    // The first create of a size makes its disk in the launcher; later ones find a ready disk.
    const first = join(base, "i1");
    mkdirSync(first);
    const cold = await disks.forInstance(first, 64);
    expect(cold.DISK_TEMPLATE).toBe(join(dir, "disk-64m.img"));
    mountDisk(first, cold);
    await disks.launched(cold);
    // The formatted image holds the overlay's dirs (upper owned by sandbox root): a copy is ready once mounted.
    const upper = statSync(join(first, "disk", "upper"));
    expect([upper.uid, upper.gid, upper.mode & 0o7777]).toEqual([100000, 100000, 0o755]);
    expect(statSync(join(first, "disk", "work")).uid).toBe(0);
    for (let i = 0; i < 200 && mountsUnder(join(dir, "ready")).length < 2; i++)
      await new Promise((r) => setTimeout(r, 50));
    expect(mountsUnder(join(dir, "ready"))).toHaveLength(2);

    const second = join(base, "i2");
    mkdirSync(second);
    const warm = await disks.forInstance(second, 64);
    expect(warm.DISK_READY).toMatch(new RegExp(`^${join(dir, "ready")}/[0-9a-f]{12}$`));
    expect(existsSync(join(second, "disk.img"))).toBe(true);
    mountDisk(second, warm);
    await disks.launched(warm);
    expect(existsSync(warm.DISK_READY as string)).toBe(false);
    // Its loop device does direct I/O (no second copy of its pages in the host's cache) and frees itself at unmount.
    const device = readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .find((line) => line.split(" ")[4] === join(second, "disk"))
      ?.split(" - ")[1]
      ?.split(" ")[1];
    const loopFlags = (name: string) => readFileSync(`/sys/block/${device?.slice(5)}/loop/${name}`, "utf8").trim();
    expect([loopFlags("dio"), loopFlags("autoclear")]).toEqual(["1", "1"]);
    expect(statSync(join(second, "disk", "upper")).uid).toBe(100000);

    // A sandbox user filling it gets ENOSPC at about the disk's size; the image holds the bytes on the disk.
    const fill = spawnSync("dd", ["if=/dev/zero", `of=${join(second, "disk", "upper", "fill")}`, "bs=1M", "count=100"]);
    expect(fill.status).not.toBe(0);
    expect(fill.stderr.toString()).toMatch(/No space left on device/);
    expect(statSync(join(second, "disk", "upper", "fill")).size).toBeGreaterThan(50 * 2 ** 20);

    for (const instance of [first, second]) execFileSync("umount", [join(instance, "disk")]);
    await disks.close();
    expect(mountsUnder(dir)).toEqual([]);
    // The kernel frees an auto-clearing loop device just after the unmount, not during it.
    const loops = () =>
      execFileSync("losetup", ["--list", "--noheadings", "--output", "BACK-FILE"], { encoding: "utf8" });
    for (let i = 0; i < 100 && loops().includes(root); i++) await new Promise((r) => setTimeout(r, 50));
    expect(loops()).not.toContain(root);
  }, 60_000);
});
