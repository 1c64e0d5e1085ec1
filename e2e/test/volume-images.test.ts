import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { Sandbox, Volume } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Image volumes (WARREN_VOLUME_IMAGES, `warren up`'s default): each volume a filesystem of its quota's size,
// loop-mounted at its folder, so the quota binds what sandboxes write, not only the content API.
const QUOTA_MB = 24;
const dataDir = mkdtempSync(join(tmpdir(), "warren-volimg-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "qi",
  nodeCidr: () => "10.242.0.0/22",
  env: { WARREN_VOLUME_IMAGES: "1", WARREN_VOLUME_QUOTA_MB: String(QUOTA_MB) },
});
let env: ClusterEnv;
const sandboxes: Sandbox[] = [];

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
    E2B_VOLUME_API_URL: env.E2B_VOLUME_API_URL,
  });
}, 600_000);

afterAll(async () => {
  await Promise.all(sandboxes.map((s) => s.kill().catch(() => undefined)));
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

async function sandboxWith(mounts: Record<string, Volume | string>): Promise<Sandbox> {
  const sandbox = await Sandbox.create("base", { volumeMounts: mounts, timeoutMs: 120_000 });
  sandboxes.push(sandbox);
  return sandbox;
}

/** The volume's folder on the host: `<volumes>/<team>/<id>`. */
function folderOf(volumeId: string): string {
  const root = join(dataDir, "volumes");
  for (const team of readdirSync(root)) if (existsSync(join(root, team, volumeId))) return join(root, team, volumeId);
  throw new Error(`volume ${volumeId} has no folder`);
}

const mountedAt = (folder: string) =>
  execFileSync("findmnt", ["--list", "--noheadings", "--output", "TARGET"], { encoding: "utf8" })
    .split("\n")
    .includes(folder);

describe("image volumes: the quota binds sandboxes too", () => {
  it("a sandbox writing past the quota gets ENOSPC; the content API is refused past it too; freed space is back", async () => {
    const volume = await Volume.create("quota-1");
    const folder = folderOf(volume.volumeId);
    expect(mountedAt(folder)).toBe(true);
    // A new volume is empty, as on E2B (no lost+found).
    expect(await volume.list("/")).toEqual([]);
    const sandbox = await sandboxWith({ "/data": volume });
    const size = Number((await sandbox.commands.run("df -B1 --output=size /data | tail -1")).stdout.trim());
    expect(size).toBeLessThanOrEqual(QUOTA_MB * 2 ** 20);
    expect(size).toBeGreaterThan((QUOTA_MB - 8) * 2 ** 20);

    const filled = await sandbox.commands.run("dd if=/dev/zero of=/data/big bs=1M count=64 2>&1; echo rc=$?", {
      user: "user",
    });
    expect(filled.stdout).toMatch(/No space left on device/);
    expect(filled.stdout).toMatch(/rc=1/);
    const written = Number((await sandbox.commands.run("stat -c %s /data/big")).stdout.trim());
    expect(written).toBeLessThanOrEqual(QUOTA_MB * 2 ** 20);
    // The content API meets the same full filesystem: 507, and the volume keeps what it had.
    await expect(volume.writeFile("/more.bin", new Uint8Array(4 * 2 ** 20))).rejects.toThrow(/507|full/);
    expect(await volume.exists("/more.bin")).toBe(false);

    await sandbox.commands.run("rm /data/big");
    await volume.writeFile("/more.bin", new Uint8Array(4 * 2 ** 20));
    expect((await sandbox.commands.run("stat -c %s /data/more.bin")).stdout.trim()).toBe(String(4 * 2 ** 20));
    // Sparse on the host: the image holds what was written, not the quota.
    const imageBlocks = statSync(`${folder}.img`).blocks * 512;
    expect(imageBlocks).toBeLessThan(QUOTA_MB * 2 ** 20);
  }, 180_000);

  it("after its filesystem was unmounted (as by a reboot), the next sandbox and the content API mount it again", async () => {
    const volume = await Volume.create("remount-1");
    await volume.writeFile("/kept.txt", "still here");
    const folder = folderOf(volume.volumeId);
    execFileSync("umount", [folder]);
    expect(mountedAt(folder)).toBe(false);
    const sandbox = await sandboxWith({ "/v": volume });
    expect((await sandbox.commands.run("cat /v/kept.txt")).stdout).toBe("still here");
    expect(mountedAt(folder)).toBe(true);
    execFileSync("umount", ["--lazy", folder]);
    expect(await volume.readFile("/kept.txt")).toBe("still here");
    expect(mountedAt(folder)).toBe(true);
  }, 120_000);

  it("destroy unmounts the volume and removes its image: no mount, loop device or file is left", async () => {
    const volume = await Volume.create("gone-1");
    const folder = folderOf(volume.volumeId);
    const sandbox = await sandboxWith({ "/v": volume });
    await sandbox.commands.run("echo x > /v/x");
    await sandbox.kill();
    await Volume.destroy(volume.volumeId);
    // The answer comes once the row is gone (the name is free); the filesystem goes right after.
    for (let i = 0; i < 100 && (mountedAt(folder) || existsSync(folder)); i++)
      await new Promise((r) => setTimeout(r, 100));
    expect(mountedAt(folder)).toBe(false);
    expect(existsSync(folder)).toBe(false);
    expect(existsSync(`${folder}.img`)).toBe(false);
    expect(
      execFileSync("losetup", ["--list", "--noheadings", "--output", "BACK-FILE"], { encoding: "utf8" }),
    ).not.toContain(`${folder}.img`);
  }, 120_000);
});
