import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import {
  existsSync,
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { type ArtifactInfo, Artifacts, Sandbox as WarrenSandbox } from "@warren/sdk";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Issue 24 part 3 through the whole cluster: a file or folder of a sandbox frozen into a tar or zip (the master runs
// tar in the sandbox through its node agent; the api keeps the bytes by digest), recorded with its digest and a
// ledger event, downloaded through short-lived signed URLs that outlive the sandbox; tenancy, delete, retention and
// the refusals. Retention is 3 per team here, so each test that counts artifacts uses a team of its own.
const dataDir = mkdtempSync(join(tmpdir(), "warren-artifacts-"));
const cliMain = join(import.meta.dirname, "../../sdk/dist/cli/main.js");
let cluster: LocalCluster;
let apiUrl = "";
let adminToken = "";
const created: WarrenSandbox[] = [];

beforeAll(async () => {
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    instancePrefix: "j",
    nodeCidr: () => "10.252.0.0/22",
    env: { WARREN_ARTIFACT_MAX_MB: "1", WARREN_ARTIFACT_RETENTION_COUNT: "3" },
  });
  const env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
  apiUrl = env.WARREN_API_URL;
  adminToken = env.WARREN_ADMIN_TOKEN;
}, 900_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster?.stop();
  if (!process.env.WARREN_E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

async function newTeam(name: string): Promise<string> {
  const res = await fetch(`${apiUrl}/warren/v1/admin/teams`, {
    method: "POST",
    headers: { "X-Admin-Token": adminToken, "Content-Type": "application/json" },
    body: JSON.stringify({ name }),
  });
  expect(res.status).toBe(201);
  return ((await res.json()) as { apiKey: { key: string } }).apiKey.key;
}

async function sandbox(apiKey?: string): Promise<WarrenSandbox> {
  const sbx = await WarrenSandbox.create("base", { timeoutMs: 600_000, ...(apiKey ? { apiKey } : {}) });
  created.push(sbx);
  return sbx;
}

function api(method: string, path: string, body?: unknown, apiKey = process.env.E2B_API_KEY as string) {
  return fetch(`${apiUrl}${path}`, {
    method,
    headers: { "X-API-KEY": apiKey, "Content-Type": "application/json" },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
}

const sha256 = (data: Uint8Array) => createHash("sha256").update(data).digest("hex");

async function signedUrl(id: string, expiresInSeconds?: number, apiKey?: string): Promise<string> {
  const res = await api("POST", `/warren/v1/artifacts/${id}/url`, expiresInSeconds ? { expiresInSeconds } : {}, apiKey);
  expect(res.status).toBe(201);
  const body = (await res.json()) as { path: string; url: string };
  expect(body.url.endsWith(body.path)).toBe(true);
  return `${apiUrl}${body.path}`;
}

async function events(sandboxId: string, apiKey?: string): Promise<{ type: string; data: Record<string, unknown> }[]> {
  const res = await api("GET", `/warren/v1/sandboxes/${sandboxId}/events?limit=100`, undefined, apiKey);
  expect(res.status).toBe(200);
  return ((await res.json()) as { events: { type: string; data: Record<string, unknown> }[] }).events;
}

/** Files left in the api's staging folder (a refused or failed publish must leave none). */
const staged = () => {
  const dir = join(dataDir, "artifacts", "staging");
  return existsSync(dir) ? readdirSync(dir) : [];
};

describe("artifacts", () => {
  it("a folder published as a tar downloads byte-identical after the sandbox is killed, symlinks kept as links", async () => {
    const sbx = await sandbox();
    const binary = randomBytes(200_000);
    const text = `report ${randomBytes(8).toString("hex")}\n`;
    await sbx.files.write("/home/user/out/data.bin", new Uint8Array(binary));
    await sbx.files.write("/home/user/out/sub/report.txt", text);
    // An absolute symlink: archived as a link in the sandbox, never followed on the host.
    await sbx.commands.run("ln -s /etc/hostname /home/user/out/host-link");

    const artifact = await sbx.artifacts.publish("/home/user/out/");
    expect(artifact).toMatchObject({ sandboxId: sbx.sandboxId, path: "/home/user/out", format: "tar" });
    expect(artifact.artifactId).toMatch(/^art_[0-9a-f]{24}$/);
    // Changes after the publish are not in it: it was frozen then.
    await sbx.files.write("/home/user/out/sub/report.txt", "changed later\n");

    const before = await sbx.artifacts.download(artifact.artifactId);
    expect(before.byteLength).toBe(artifact.sizeBytes);
    expect(sha256(before)).toBe(artifact.sha256);
    const url = await signedUrl(artifact.artifactId, 600);

    const published = (await events(sbx.sandboxId)).filter((e) => e.type === "artifact.published");
    expect(published).toHaveLength(1);
    expect(published[0]?.data).toMatchObject({
      artifactId: artifact.artifactId,
      path: "/home/user/out",
      sha256: artifact.sha256,
      sizeBytes: artifact.sizeBytes,
    });

    await sbx.kill();
    const res = await fetch(url);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/x-tar");
    expect(res.headers.get("content-disposition")).toContain('filename="out.tar"');
    const after = new Uint8Array(await res.arrayBuffer());
    expect(Buffer.compare(Buffer.from(after), Buffer.from(before))).toBe(0);
    // A fresh URL for a killed sandbox's artifact works too.
    expect(sha256(await new Artifacts({}).download(artifact.artifactId))).toBe(artifact.sha256);

    const dir = mkdtempSync(join(tmpdir(), "warren-artifact-x-"));
    try {
      writeFileSync(join(dir, "a.tar"), after);
      execFileSync("tar", ["-xf", join(dir, "a.tar"), "-C", dir]);
      expect(readFileSync(join(dir, "out/data.bin")).equals(binary)).toBe(true);
      expect(readFileSync(join(dir, "out/sub/report.txt"), "utf8")).toBe(text);
      expect(lstatSync(join(dir, "out/host-link")).isSymbolicLink()).toBe(true);
      expect(readlinkSync(join(dir, "out/host-link"))).toBe("/etc/hostname");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);

  it("a file published as a zip holds that file, past root's chatty profile; the CLI publishes and saves one", async () => {
    const sbx = await sandbox();
    await sbx.files.write("/tmp/notes.md", "# notes\nzip me\n");
    // The archive runs in root's login shell: what its profile and logout print must not get into the archive.
    await sbx.commands.run(
      "echo 'echo hello-from-profile' > /root/.bash_profile; echo 'echo bye' > /root/.bash_logout",
      {
        user: "root",
      },
    );
    const zip = await sbx.artifacts.publish("/tmp/notes.md", { format: "zip" });
    // (It does print: a login shell's `true` says hello, and bye at its exit.)
    expect((await sbx.commands.run("true; exit 0", { user: "root" })).stdout).toBe("hello-from-profile\nbye\n");
    expect(zip.format).toBe("zip");
    const bytes = await sbx.artifacts.download(zip.artifactId);
    expect(sha256(bytes)).toBe(zip.sha256);
    const dir = mkdtempSync(join(tmpdir(), "warren-artifact-z-"));
    try {
      writeFileSync(join(dir, "a.zip"), bytes);
      expect(execFileSync("unzip", ["-p", join(dir, "a.zip"), "notes.md"], { encoding: "utf8" })).toBe(
        "# notes\nzip me\n",
      );

      const cli = execFileSync(
        process.execPath,
        [cliMain, "sandbox", "publish", sbx.sandboxId, "/tmp/notes.md", "--json", "--out", join(dir, "cli.tar")],
        { encoding: "utf8", env: { ...process.env, WARREN_API_URL: apiUrl, WARREN_DATA_DIR: dir } },
      );
      const info = JSON.parse(cli) as { artifactId: string; sha256: string; format: string };
      expect(info.format).toBe("tar");
      expect(sha256(readFileSync(join(dir, "cli.tar")))).toBe(info.sha256);
      expect(execFileSync("tar", ["-xOf", join(dir, "cli.tar"), "notes.md"], { encoding: "utf8" })).toBe(
        "# notes\nzip me\n",
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);

  it("a URL is refused after it expires, when tampered with, for another artifact; another team gets 404s", async () => {
    const keyB = await newTeam("artifacts-b");
    const sbx = await sandbox();
    await sbx.files.write("/tmp/a.txt", "a");
    await sbx.files.write("/tmp/b.txt", "b");
    const a = await sbx.artifacts.publish("/tmp/a.txt");
    const b = await sbx.artifacts.publish("/tmp/b.txt");

    const short = await signedUrl(a.artifactId, 1);
    const urlA = await signedUrl(a.artifactId, 600);
    const urlB = await signedUrl(b.artifactId, 600);
    // B's signature on A's id, A's with a later expiry, a flipped signature, none at all.
    const sigB = new URL(urlB).searchParams;
    const swapped = `${apiUrl}/warren/v1/artifacts/${a.artifactId}/download?${sigB.toString()}`;
    const later = new URL(urlA);
    later.searchParams.set("expires", String(Number(later.searchParams.get("expires")) + 3600));
    const flipped = new URL(urlA);
    const sig = flipped.searchParams.get("sig") as string;
    flipped.searchParams.set("sig", `${sig[0] === "A" ? "B" : "A"}${sig.slice(1)}`);
    for (const bad of [swapped, later.toString(), flipped.toString()]) {
      const res = await fetch(bad);
      expect(res.status).toBe(403);
      expect(((await res.json()) as { message: string }).message).toMatch(/signature does not match/);
    }
    const unsigned = await fetch(`${apiUrl}/warren/v1/artifacts/${a.artifactId}/download`);
    expect(unsigned.status).toBe(403);
    expect((await fetch(urlA)).status).toBe(200);

    await new Promise((resolve) => setTimeout(resolve, 2_100));
    const expired = await fetch(short);
    expect(expired.status).toBe(403);
    expect(((await expired.json()) as { message: string }).message).toMatch(/expired/);

    // Team B: nothing of team A's, anywhere.
    expect((await api("GET", `/warren/v1/artifacts/${a.artifactId}`, undefined, keyB)).status).toBe(404);
    expect((await api("POST", `/warren/v1/artifacts/${a.artifactId}/url`, {}, keyB)).status).toBe(404);
    expect((await api("DELETE", `/warren/v1/artifacts/${a.artifactId}`, undefined, keyB)).status).toBe(404);
    const publishB = await api("POST", `/warren/v1/sandboxes/${sbx.sandboxId}/artifacts`, { path: "/tmp" }, keyB);
    expect(publishB.status).toBe(404);
    const listB = (await (await api("GET", "/warren/v1/artifacts", undefined, keyB)).json()) as unknown[];
    expect(listB).toEqual([]);
    const sandboxListB = await api("GET", `/warren/v1/sandboxes/${sbx.sandboxId}/artifacts`, undefined, keyB);
    expect(await sandboxListB.json()).toEqual([]);
    expect((await api("GET", `/warren/v1/artifacts/${a.artifactId}`)).status).toBe(200);
  }, 300_000);

  it("lists a team's and a sandbox's artifacts; a delete removes it and its URLs", async () => {
    const key = await newTeam("artifacts-list");
    const sbx = await sandbox(key);
    const other = await sandbox(key);
    await sbx.files.write("/tmp/one", "one");
    await other.files.write("/tmp/two", "two");
    const one = await sbx.artifacts.publish("/tmp/one");
    const two = await other.artifacts.publish("/tmp/two");
    const team = new Artifacts({ apiKey: key });
    expect((await team.list()).map((x) => x.artifactId)).toEqual([two.artifactId, one.artifactId]);
    expect((await sbx.artifacts.list()).map((x) => x.artifactId)).toEqual([one.artifactId]);
    expect(await team.getInfo(one.artifactId)).toEqual(one);

    const url = await signedUrl(one.artifactId, 600, key);
    expect(await team.delete(one.artifactId)).toBe(true);
    expect(await team.delete(one.artifactId)).toBe(false);
    expect((await api("GET", `/warren/v1/artifacts/${one.artifactId}`, undefined, key)).status).toBe(404);
    expect((await fetch(url)).status).toBe(404);
    expect((await team.list()).map((x) => x.artifactId)).toEqual([two.artifactId]);
    expect(existsSync(join(dataDir, "artifacts", "sha256", one.sha256))).toBe(false);
    expect(existsSync(join(dataDir, "artifacts", "sha256", two.sha256))).toBe(true);
    const deleted = (await events(sbx.sandboxId, key)).filter((e) => e.type === "artifact.deleted");
    expect(deleted.map((e) => e.data)).toEqual([{ artifactId: one.artifactId, reason: "deleted" }]);
  }, 300_000);

  it("retention keeps a team's newest 3: a fourth publish drops the oldest and its bytes", async () => {
    const key = await newTeam("artifacts-retention");
    const sbx = await sandbox(key);
    const made: ArtifactInfo[] = [];
    for (let i = 0; i < 4; i++) {
      await sbx.files.write(`/tmp/r${i}`, `retained ${i}`);
      made.push(await sbx.artifacts.publish(`/tmp/r${i}`));
    }
    const kept = (await new Artifacts({ apiKey: key }).list()).map((x) => x.artifactId);
    expect(kept).toEqual([made[3], made[2], made[1]].map((x) => x?.artifactId));
    expect(existsSync(join(dataDir, "artifacts", "sha256", made[0]?.sha256 as string))).toBe(false);
    const ledger = await events(sbx.sandboxId, key);
    expect(ledger.filter((e) => e.type === "artifact.published")).toHaveLength(4);
    expect(ledger.filter((e) => e.type === "artifact.deleted").map((e) => e.data)).toEqual([
      { artifactId: made[0]?.artifactId, reason: "retention" },
    ]);
  }, 300_000);

  it("refuses bad paths, formats and sizes with a message, and leaves nothing behind", async () => {
    const key = await newTeam("artifacts-bad");
    const sbx = await sandbox(key);
    const publish = (body: unknown, id = sbx.sandboxId) =>
      api("POST", `/warren/v1/sandboxes/${id}/artifacts`, body, key);
    const refusals: [unknown, number, RegExp][] = [
      [{ path: "tmp/x" }, 400, /must be absolute/],
      [{ path: "" }, 400, /non-empty string/],
      [{}, 400, /path must be/],
      [{ path: "/" }, 400, /whole sandbox/],
      [{ path: "/tmp", format: "rar" }, 400, /format must be "tar" or "zip"/],
      [{ path: "/no/such/file" }, 404, /'\/no\/such\/file' does not exist/],
    ];
    for (const [body, status, message] of refusals) {
      const res = await publish(body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      expect(((await res.json()) as { message: string }).message).toMatch(message);
    }
    const unknown = await publish({ path: "/tmp" }, "nosuchsandbox0000000");
    expect(unknown.status).toBe(404);

    // 1 MiB is the limit here: 2 MiB of random bytes do not fit.
    await sbx.commands.run("head -c 2097152 /dev/urandom > /tmp/big.bin");
    const big = await publish({ path: "/tmp/big.bin" });
    expect(big.status).toBe(413);
    expect(((await big.json()) as { message: string }).message).toMatch(/more than the 1048576 bytes/);
    expect(await new Artifacts({ apiKey: key }).list()).toEqual([]);
    expect(staged()).toEqual([]);
    // The sandbox is still usable and its files intact after the refusals.
    expect((await sbx.commands.run("stat -c %s /tmp/big.bin")).stdout.trim()).toBe("2097152");
    await sbx.files.write("/tmp/small.txt", "small");
    const fine = await sbx.artifacts.publish("/tmp/x/..//small.txt/");
    expect(fine.path).toBe("/tmp/small.txt");

    // A paused sandbox is not archived behind its back: resume it first.
    await WarrenSandbox.pause(sbx.sandboxId, { apiKey: key });
    const paused = await publish({ path: "/tmp/small.txt" });
    expect(paused.status).toBe(409);
    expect(((await paused.json()) as { message: string }).message).toMatch(/is paused/);
  }, 300_000);
});
