import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { Sandbox, Volume, VolumeNotFoundError, VolumePathNotFoundError } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// E2B volumes through the whole cluster with the official SDK: a team's persistent folder, its content API
// (chrooted per call), and `volumeMounts` binding it into sandboxes (an idmapped bind: the same owners in every
// sandbox and in the content API).
const dataDir = mkdtempSync(join(tmpdir(), "warren-volumes-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 2,
  poolSize: 1,
  instancePrefix: "d",
  nodeCidr: (i) => `10.248.${i * 4}.0/22`,
  // Plain folders on a filesystem the nodes share (NFS's layout, as the chart runs it); image volumes, one
  // filesystem per volume on one host (`warren up`), are volume-images.test.ts's.
  env: { WARREN_VOLUME_IMAGES: "0" },
});
let env: ClusterEnv;
const sandboxes: Sandbox[] = [];
const volumes: string[] = [];

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
  await Promise.all(volumes.map((id) => Volume.destroy(id).catch(() => undefined)));
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

async function newVolume(name: string): Promise<Volume> {
  const volume = await Volume.create(name);
  volumes.push(volume.volumeId);
  return volume;
}

async function sandboxWith(mounts: Record<string, Volume | string>): Promise<Sandbox> {
  const sandbox = await Sandbox.create("base", { volumeMounts: mounts, timeoutMs: 120_000 });
  sandboxes.push(sandbox);
  return sandbox;
}

async function otherTeamKey(): Promise<string> {
  const res = await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams`, {
    method: "POST",
    headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN, "Content-Type": "application/json" },
    body: JSON.stringify({ name: "volume-neighbours" }),
  });
  expect(res.status).toBe(201);
  return ((await res.json()) as { apiKey: { key: string } }).apiKey.key;
}

describe("volumes: the control plane", () => {
  it("creates, lists, describes, connects and destroys a volume; names are checked", async () => {
    const volume = await newVolume("control-1");
    expect(volume.volumeId).toMatch(/^[0-9a-f-]{36}$/);
    expect(volume.name).toBe("control-1");
    expect(await Volume.list()).toContainEqual({ volumeId: volume.volumeId, name: "control-1" });
    const info = await Volume.getInfo(volume.volumeId);
    expect(info).toMatchObject({ volumeId: volume.volumeId, name: "control-1" });
    expect(info.token).not.toBe(volume.token);
    const connected = await Volume.connect(volume.volumeId);
    await connected.writeFile("/hello.txt", "hi");
    expect(await volume.readFile("/hello.txt")).toBe("hi");

    await expect(Volume.create("control-1")).rejects.toThrow(/already exists/);
    await expect(Volume.create("bad name!")).rejects.toThrow(/Invalid volume name/);
    await expect(Volume.getInfo("00000000-0000-4000-8000-000000000000")).rejects.toBeInstanceOf(VolumeNotFoundError);
    await expect(Volume.getInfo("not-a-uuid")).rejects.toThrow(/must be a UUID/);

    expect(await Volume.destroy(volume.volumeId)).toBe(true);
    expect(await Volume.destroy(volume.volumeId)).toBe(false);
    // Its tokens went with it.
    await expect(volume.readFile("/hello.txt")).rejects.toThrow(/Unauthorized|401/);
    // The name is free again.
    await newVolume("control-1");
  });

  it("another team's volume is not found, and its token opens nothing else", async () => {
    const mine = await newVolume("private-1");
    const key = await otherTeamKey();
    await expect(Volume.getInfo(mine.volumeId, { apiKey: key })).rejects.toBeInstanceOf(VolumeNotFoundError);
    expect(await Volume.destroy(mine.volumeId, { apiKey: key })).toBe(false);
    expect((await Volume.list({ apiKey: key })).map((v) => v.volumeId)).not.toContain(mine.volumeId);
    // The other team cannot mount this team's volume by its name.
    await expect(Sandbox.create("base", { apiKey: key, volumeMounts: { "/mnt/x": "private-1" } })).rejects.toThrow(
      /volume 'private-1' not found/,
    );
    // A volume of the same name in the other team is another volume.
    const theirs = await Volume.create("private-1", { apiKey: key });
    expect(theirs.volumeId).not.toBe(mine.volumeId);
    // A token is for its own volume only.
    const res = await fetch(`${env.E2B_VOLUME_API_URL}/volumecontent/${mine.volumeId}/path?path=%2F`, {
      headers: { Authorization: `Bearer ${theirs.token}` },
    });
    expect(res.status).toBe(401);
    await Volume.destroy(theirs.volumeId, { apiKey: key });
  });
});

describe("volumes: the content API", () => {
  it("writes, reads, lists, stats, changes and removes entries with E2B's semantics", async () => {
    const volume = await newVolume("content-1");
    const written = await volume.writeFile("/docs/readme.md", "# hello", { force: true });
    expect(written).toMatchObject({ name: "readme.md", path: "/docs/readme.md", type: "file", size: 7 });
    expect(written).toMatchObject({ uid: 9090, gid: 9090, mode: 0o666 });
    // Without force a write is an exclusive create.
    await expect(volume.writeFile("/docs/readme.md", "again")).rejects.toThrow(/409/);
    await expect(volume.writeFile("/missing/dir/x.txt", "x")).rejects.toBeInstanceOf(VolumePathNotFoundError);
    await volume.writeFile("/docs/readme.md", "# replaced", { force: true });
    expect(await volume.readFile("/docs/readme.md")).toBe("# replaced");
    const bytes = new Uint8Array([0, 1, 2, 255, 254]);
    await volume.writeFile("/bin.dat", bytes);
    expect(await volume.readFile("/bin.dat", { format: "bytes" })).toEqual(bytes);

    const dir = await volume.makeDir("/a/b/c", { force: true, mode: 0o750, uid: 1000, gid: 1000 });
    expect(dir).toMatchObject({ type: "directory", mode: 0o750, uid: 1000 });
    await expect(volume.makeDir("/x/y")).rejects.toBeInstanceOf(VolumePathNotFoundError);
    await expect(volume.makeDir("/a/b/c")).rejects.toThrow(/409/);
    const entries = await volume.list("/", { depth: 3 });
    expect(entries.map((e) => e.path).sort()).toEqual(["/a", "/a/b", "/a/b/c", "/bin.dat", "/docs", "/docs/readme.md"]);
    await expect(volume.list("/", { depth: 11 })).rejects.toThrow(/400/);
    expect(await volume.exists("/docs/readme.md")).toBe(true);
    expect(await volume.exists("/nope")).toBe(false);

    const changed = await volume.updateMetadata("/docs/readme.md", { mode: 0o600, uid: 1000 });
    expect(changed).toMatchObject({ mode: 0o600, uid: 1000, gid: 9090 });
    await volume.remove("/a");
    expect(await volume.exists("/a/b")).toBe(false);
    await expect(volume.remove("/a")).rejects.toBeInstanceOf(VolumePathNotFoundError);
    await expect(volume.remove("/")).rejects.toThrow(/400/);
    // `..` never leaves the volume: it is the volume's root.
    expect((await volume.getInfo("/../../..")).path).toBe("/");
  }, 90_000);
});

describe("volumes: mounted into sandboxes", () => {
  it("shares files between sandboxes running at once on two nodes and outlives them", async () => {
    const volume = await newVolume("shared-1");
    const a = await sandboxWith({ "/mnt/data": volume });
    // The second sandbox runs on the other node: both nodes bind the same shared folder.
    const nodeA = await cluster.nodeOf(a.sandboxId);
    expect(await cluster.cordon(nodeA, true)).toBe(204);
    let b: Sandbox;
    try {
      b = await sandboxWith({ "/mnt/data": "shared-1" });
    } finally {
      expect(await cluster.cordon(nodeA, false)).toBe(204);
    }
    expect(await cluster.nodeOf(b.sandboxId)).not.toBe(nodeA);
    expect((await a.getInfo()).volumeMounts).toEqual([{ name: "shared-1", path: "/mnt/data" }]);

    await a.commands.run("echo from-a > /mnt/data/note.txt && mkdir /mnt/data/work");
    expect((await b.commands.run("cat /mnt/data/note.txt")).stdout).toBe("from-a\n");
    // Owners are the same everywhere: `user` (1000) in a, in b and in the content API.
    expect((await b.commands.run("stat -c '%U %u' /mnt/data/note.txt")).stdout.trim()).toBe("user 1000");
    expect(await volume.getInfo("/note.txt")).toMatchObject({ uid: 1000, gid: 1000 });
    await b.commands.run("echo from-b >> /mnt/data/note.txt");
    expect(await volume.readFile("/note.txt")).toBe("from-a\nfrom-b\n");
    await volume.writeFile("/from-api.txt", "api", { force: true });
    expect((await a.commands.run("cat /mnt/data/from-api.txt")).stdout).toBe("api");

    await a.kill();
    await b.kill();
    const c = await sandboxWith({ "/data": volume });
    expect((await c.commands.run("cat /data/note.txt")).stdout).toBe("from-a\nfrom-b\n");
  }, 180_000);

  it("a paused sandbox keeps its volume mounted when it resumes", async () => {
    const volume = await newVolume("pause-1");
    const sandbox = await sandboxWith({ "/mnt/v": volume });
    await sandbox.commands.run("echo before > /mnt/v/state");
    await sandbox.betaPause();
    await volume.writeFile("/while-paused", "x", { force: true });
    const resumed = await Sandbox.connect(sandbox.sandboxId);
    expect((await resumed.commands.run("cat /mnt/v/state /mnt/v/while-paused")).stdout).toBe("before\nx");
  }, 120_000);

  it("a symlink a sandbox leaves in the volume resolves inside the volume, never on the host", async () => {
    const volume = await newVolume("escape-1");
    const sandbox = await sandboxWith({ "/mnt/v": volume });
    await sandbox.commands.run("ln -s /etc /mnt/v/etc-link && ln -s / /mnt/v/root-link", { user: "root" });
    // On the host, /etc/hostname exists; in the volume there is no /etc.
    expect(statSync("/etc/hostname").isFile()).toBe(true);
    await expect(volume.readFile("/etc-link/hostname")).rejects.toBeInstanceOf(VolumePathNotFoundError);
    const listed = await volume.list("/root-link/");
    expect(listed.map((e) => e.name).sort()).toEqual(["etc-link", "root-link"]);
    await expect(volume.writeFile("/etc-link/evil", "x", { force: true })).rejects.toThrow();
    expect(() => statSync("/etc/evil")).toThrow();
    // Inside the sandbox the mount's parent is the sandbox's own root.
    expect((await sandbox.commands.run("cat /mnt/v/../../etc/hostname")).stdout.trim()).toBe("sandbox");
  }, 120_000);

  it("bad mounts are refused with E2B's reasons, and nothing is left", async () => {
    await newVolume("mounts-1");
    const before = (await Sandbox.list().nextItems()).length;
    const refused = async (mounts: Record<string, string>, reason: RegExp) =>
      expect(Sandbox.create("base", { volumeMounts: mounts })).rejects.toThrow(reason);
    await refused({ "relative/path": "mounts-1" }, /volume mount #0: path must be absolute/);
    await refused({ "/a/../b": "mounts-1" }, /must not contain any '\.' or '\.\.' components/);
    await refused({ "/mnt/v": "no-such-volume" }, /volume 'no-such-volume' not found/);
    await refused({ "/proc/x": "mounts-1" }, /reserved/);
    expect((await Sandbox.list().nextItems()).length).toBe(before);
  });
});
