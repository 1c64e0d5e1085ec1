import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_CHUNK } from "../src/node-agent/content-chunks.js";
import { createLogger } from "../src/node-agent/log.js";
import { OciStore } from "../src/node-agent/oci-store.js";
import { PackCache } from "../src/node-agent/pack-cache.js";
import { type SnapshotParts, SnapshotStore } from "../src/node-agent/snapshot-store.js";
import { type LoopbackRegistry, startLoopbackRegistry } from "./loopback-registry.js";

// The snapshot store in an OCI registry (Debian's docker-registry on loopback, behind htpasswd): own parts go in as
// packs through the distribution API (against their base: only the units it lacks), come back checked blob by
// blob, and a part published as one skopeo layer before packs still pulls.
const root = mkdtempSync(join(tmpdir(), "warren-store-registry-"));
const auth = { username: "warren", password: "store-secret-4711" };
let registry: LoopbackRegistry;
let store: SnapshotStore;

const log = createLogger("snapshot-store-registry-test", { level: "error" });
const config = (password: string) => ({
  url: `docker://${registry.host}/warren`,
  insecure: true,
  username: auth.username,
  password,
});

beforeAll(async () => {
  const htpasswd = join(root, "htpasswd");
  writeFileSync(htpasswd, execFileSync("htpasswd", ["-Bbn", auth.username, auth.password]));
  registry = await startLoopbackRegistry(join(root, "registry"), htpasswd);
  store = new SnapshotStore(config(auth.password), join(root, "work"), log);
});

afterAll(() => {
  registry?.process.kill("SIGKILL");
  rmSync(root, { recursive: true, force: true });
});

function parts(data: Buffer): SnapshotParts {
  return {
    own: async function* () {
      for (let at = 0; at < data.length; at += 100_000) yield data.subarray(at, at + 100_000);
    },
    layers: [],
    layer: () => (async function* () {})(),
  };
}

async function read(data: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of data) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks);
}

describe("the registry snapshot store", () => {
  it("sends a snapshot packed against its base as the units around a small change, and pulls both whole", async () => {
    const memory = randomBytes(3 << 20);
    const changed = Buffer.concat([memory.subarray(0, 1 << 20), randomBytes(4096), memory.subarray(1 << 20)]);
    changed.writeBigUInt64LE(7n, 2 << 20);
    const first = await store.publish("rchunk1", parts(memory), {});
    expect(first.sizeBytes).toBe(memory.length);
    expect(first.uploadedBytes).toBeGreaterThanOrEqual(memory.length);
    const second = await store.publish("rchunk2", parts(changed), { base: "rchunk1" });
    // The units around the two changes, and the index of every unit.
    expect(second.uploadedBytes).toBeGreaterThan(4096);
    expect(second.uploadedBytes).toBeLessThan(4 * MAX_CHUNK + 1000 * 100);
    expect((await store.listPublished()).sort()).toEqual(["rchunk1", "rchunk2"]);
    // Another node (another store client, no token yet) pulls them, each checked against its digest; the packs it
    // fetched for the first stay in its cache, so the second brings its own new pack (and index) alone.
    const cache = new PackCache(join(root, "pack-cache"), 64 * 2 ** 20);
    const other = new SnapshotStore(config(auth.password), join(root, "work-other"), log, cache);
    const pulledFirst = await other.pull("rchunk1", first.digest, () => false, read);
    expect(pulledFirst.result.equals(memory)).toBe(true);
    expect(pulledFirst.downloadedBytes).toBeGreaterThanOrEqual(memory.length);
    const pulledSecond = await other.pull("rchunk2", second.digest, () => false, read);
    expect(pulledSecond.result.equals(changed)).toBe(true);
    expect(pulledSecond.downloadedBytes).toBeLessThan(4 * MAX_CHUNK + 1000 * 100);
    // A damaged cached pack is noticed (its digest), dropped and fetched again.
    const [cachedPack] = readdirSync(join(root, "pack-cache"));
    writeFileSync(join(root, "pack-cache", cachedPack ?? ""), "damaged");
    const again = await other.pull("rchunk2", second.digest, () => false, read);
    expect(again.result.equals(changed)).toBe(true);
    await expect(other.pull("rchunk2", first.digest, () => false, read)).rejects.toThrow(
      /does not match the published/,
    );
    expect(readdirSync(join(root, "work-other"))).toEqual([]);
  });

  it("pulls an own part published as one compressed layer through skopeo (before packs)", async () => {
    const oci = new OciStore(config(auth.password), join(root, "work"));
    const text = "one layer of everything";
    const legacy = await oci.push(
      "rlegacy",
      (async function* () {
        yield Buffer.from(text);
      })(),
      () => ({ "dev.warren.snapshot": "rlegacy" }),
    );
    expect((await store.pull("rlegacy", legacy.digest, () => false, read)).result.toString()).toBe(text);
  });

  it("fails with the registry's answer to a wrong password, never the password", async () => {
    const wrong = new SnapshotStore(config("not-the-password"), join(root, "work-wrong"), log);
    const failed = await wrong.publish("rwrong", parts(randomBytes(10_000)), {}).then(
      () => undefined,
      (error: Error) => error,
    );
    expect(failed?.message).toMatch(/401|unauthorized/);
    expect(failed?.message).not.toContain("not-the-password");
    expect(await store.listPublished()).not.toContain("rwrong");
  });
});
