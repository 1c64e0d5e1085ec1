import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { MAX_CHUNK } from "./content-chunks.js";
import { createLogger } from "./log.js";
import { OciStore } from "./oci-store.js";
import { type SnapshotParts, SnapshotStore } from "./snapshot-store.js";

// The embedded store (an OCI layout directory): publish, list, pull with the digest checked, and unpublish with
// the blobs nothing else refers to removed; snapshots with shared layers push and pull only the layers the other
// side lacks. skopeo and umoci are the real tools (scripts/setup-host.sh).
const root = mkdtempSync(join(tmpdir(), "warren-store-"));
const storeDir = join(root, "store");
const store = new SnapshotStore(
  { url: `oci:${join(root, "store")}`, insecure: false },
  join(root, "work"),
  createLogger("snapshot-store-test", { level: "error" }),
);

afterAll(() => rmSync(root, { recursive: true, force: true }));

async function* bytes(text: string): AsyncIterable<Uint8Array> {
  yield Buffer.from(text);
}

/** A snapshot of one part (a driver without shared layers). */
const whole = (text: string): SnapshotParts => ({ own: () => bytes(text), layers: [], layer: () => bytes("") });

/** A snapshot whose own part is `own` over shared layers (name → content), each export counted. */
function layered(own: string, layers: Record<string, string>, exported: string[] = []): SnapshotParts {
  return {
    own: () => bytes(own),
    layers: Object.keys(layers),
    layer: (name) => {
      exported.push(name);
      return bytes(layers[name] ?? "");
    },
  };
}

const nothing = () => false;

async function collect(data: AsyncIterable<Uint8Array>): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of data) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks).toString();
}

const blobs = () => readdirSync(join(root, "store", "blobs", "sha256")).length;

describe("the OCI layout snapshot store", () => {
  it("lists nothing before the first publish", async () => {
    expect(await store.listPublished()).toEqual([]);
  });

  it("publishes, lists and pulls snapshots, each checked against its digest", async () => {
    const one = await store.publish("sone", whole("first snapshot"), { kind: "test" });
    await store.publish("stwo", whole("second snapshot"), { kind: "test" });
    expect((await store.listPublished()).sort()).toEqual(["sone", "stwo"]);
    expect((await store.pull("sone", one.digest, nothing, collect)).result).toBe("first snapshot");
    await expect(store.pull("stwo", one.digest, nothing, collect)).rejects.toThrow(/does not match the published/);
  });

  it("refuses a snapshot whose layer was changed in the store (the blob no longer matches its digest)", async () => {
    const published = await store.publish("stamper", whole("original content"), { kind: "test" });
    // The store's own copy of the layer (skopeo may have compressed it: its blob name is not the published digest).
    const blob = (digest: string) => join(root, "store", "blobs", "sha256", digest.slice("sha256:".length));
    const index = JSON.parse(readFileSync(join(root, "store", "index.json"), "utf8")) as {
      manifests: { digest: string; annotations: Record<string, string> }[];
    };
    const entry = index.manifests.find((m) => m.annotations["org.opencontainers.image.ref.name"] === "stamper");
    const manifest = JSON.parse(readFileSync(blob(entry?.digest ?? ""), "utf8")) as { layers: { digest: string }[] };
    writeFileSync(blob(manifest.layers[0]?.digest ?? ""), "tampered content");
    await expect(store.pull("stamper", published.digest, nothing, collect)).rejects.toThrow(/digest|match/i);
    // Nothing of the failed pull is left in the node's work folder.
    expect(readdirSync(join(root, "work"))).toEqual([]);
    await store.unpublish("stamper");
  });

  it("unpublishing removes the tag and the blobs only it used, and is idempotent", async () => {
    const before = blobs();
    await store.unpublish("sone");
    expect(await store.listPublished()).toEqual(["stwo"]);
    // Its manifest, config, index and pack went; the other snapshot's stay.
    expect(blobs()).toBe(before - 4);
    await store.unpublish("sone");
    expect(await store.listPublished()).toEqual(["stwo"]);
    await expect(store.unpublish("../x")).rejects.toThrow(/not a snapshot id/);
  });

  it("pushes a shared layer once and pulls only the layers a node lacks, each checked by digest", async () => {
    const exported: string[] = [];
    const first = await store.publish("sbase", layered("base own", { lbase: "template files" }, exported), {});
    // Uploads count the own part's index too (a few hundred bytes here).
    const index = 500;
    expect(first.sizeBytes).toBe(8 + 14);
    expect(first.uploadedBytes).toBeGreaterThanOrEqual(8 + 14);
    expect(first.uploadedBytes).toBeLessThan(8 + 14 + index);
    // A sandbox over the same template: its own layer is new, the template's is in the store already.
    const second = await store.publish(
      "spause",
      layered("pause own", { lsandbox: "sandbox files", lbase: "template files" }, exported),
      {},
    );
    expect(exported).toEqual(["lbase", "lsandbox"]);
    expect(second.sizeBytes).toBe(9 + 13 + 14);
    expect(second.uploadedBytes).toBeGreaterThanOrEqual(9 + 13);
    expect(second.uploadedBytes).toBeLessThan(9 + 13 + index);
    // Shared layers are not snapshots.
    expect((await store.listPublished()).sort()).toEqual(["sbase", "spause", "stwo"]);
    // A node without any layer gets the own part first, then every layer, as one stream.
    // (Its own part's index is read too: a few hundred bytes here.)
    const fresh = await store.pull("spause", second.digest, nothing, collect);
    expect(fresh.result).toBe("pause ownsandbox filestemplate files");
    expect(fresh.downloadedBytes).toBeGreaterThanOrEqual(9 + 13 + 14);
    expect(fresh.downloadedBytes).toBeLessThan(9 + 13 + 14 + index);
    // A node holding the template's layer gets the rest only.
    const warm = await store.pull("spause", second.digest, (layer) => layer === "lbase", collect);
    expect(warm.result).toBe("pause ownsandbox files");
    expect(warm.downloadedBytes).toBe(fresh.downloadedBytes - 14);
    // Another digest (another snapshot's parts list) is refused.
    await expect(store.pull("spause", first.digest, nothing, collect)).rejects.toThrow(/does not match/);
  });

  it("refuses a shared layer changed in the store", async () => {
    const published = await store.publish("sshared", layered("own", { ltamper: "layer content" }), {});
    const index = JSON.parse(readFileSync(join(root, "store", "index.json"), "utf8")) as {
      manifests: { digest: string; annotations: Record<string, string> }[];
    };
    const entry = index.manifests.find((m) => m.annotations["org.opencontainers.image.ref.name"] === "layer.ltamper");
    const blob = (digest: string) => join(root, "store", "blobs", "sha256", digest.slice("sha256:".length));
    const manifest = JSON.parse(readFileSync(blob(entry?.digest ?? ""), "utf8")) as { layers: { digest: string }[] };
    const layerBlob = blob(manifest.layers[0]?.digest ?? "");
    writeFileSync(layerBlob, "layer CONTENT");
    // Read in place from the layout, checked against the parts list as it streams.
    await expect(store.pull("sshared", published.digest, nothing, collect)).rejects.toThrow(
      /'layer.ltamper' in the store does not match the published/,
    );
    // A node that has the layer does not read it and is not affected.
    expect((await store.pull("sshared", published.digest, (l) => l === "ltamper", collect)).result).toBe("own");
    writeFileSync(layerBlob, "layer content");
    // A well-formed image tagged in its place (another layer's) is refused by the parts list's digest.
    execFileSync("skopeo", [
      "--insecure-policy",
      "copy",
      `oci:${storeDir}:layer.lbase`,
      `oci:${storeDir}:layer.ltamper`,
    ]);
    await expect(store.pull("sshared", published.digest, nothing, collect)).rejects.toThrow(
      /'layer.ltamper' in the store does not match the published/,
    );
    await store.unpublish("sshared");
  });

  it("packs an own part against its base: published again after a small change, it adds only what changed", async () => {
    // A memory image's worth of bytes, then the same with a page inserted and 8 bytes changed further on.
    const memory = randomBytes(4 << 20);
    const changed = Buffer.concat([memory.subarray(0, 1 << 20), randomBytes(4096), memory.subarray(1 << 20)]);
    changed.writeBigUInt64LE(7n, 3 << 20);
    const parts = (data: Buffer): SnapshotParts => ({
      own: async function* () {
        for (let at = 0; at < data.length; at += 100_000) yield data.subarray(at, at + 100_000);
      },
      layers: [],
      layer: () => bytes(""),
    });
    const first = await store.publish("spack1", parts(memory), {});
    expect(first.sizeBytes).toBe(memory.length);
    expect(first.uploadedBytes).toBeGreaterThanOrEqual(memory.length);
    const blobsAfterFirst = blobs();
    const second = await store.publish("spack2", parts(changed), { base: "spack1" });
    expect(second.sizeBytes).toBe(changed.length);
    // Two changes, each within at most two units, and the index of every unit.
    const indexBytes = 1000 * 100;
    expect(second.uploadedBytes).toBeGreaterThan(4096);
    expect(second.uploadedBytes).toBeLessThan(4 * MAX_CHUNK + indexBytes);
    // Its pack, its index, its config and its manifest.
    expect(blobs() - blobsAfterFirst).toBe(4);
    const read = async (data: AsyncIterable<Uint8Array>) => {
      const chunks: Buffer[] = [];
      for await (const chunk of data) chunks.push(Buffer.from(chunk));
      return Buffer.concat(chunks);
    };
    // Unpublishing the base keeps the pack the second one still uses.
    await store.unpublish("spack1");
    expect((await store.pull("spack2", second.digest, nothing, read)).result.equals(changed)).toBe(true);
    // A pack changed in the store is refused, whatever the rest.
    const index = JSON.parse(readFileSync(join(storeDir, "index.json"), "utf8")) as {
      manifests: { digest: string; annotations?: Record<string, string> }[];
    };
    const entry = index.manifests.find((m) => m.annotations?.["org.opencontainers.image.ref.name"] === "spack2");
    const blob = (digest: string) => join(storeDir, "blobs", "sha256", digest.slice("sha256:".length));
    const manifest = JSON.parse(readFileSync(blob(entry?.digest ?? ""), "utf8")) as { layers: { digest: string }[] };
    // The index, the base's pack and its own.
    expect(manifest.layers).toHaveLength(3);
    const victim = blob(manifest.layers[1]?.digest ?? "");
    const original = readFileSync(victim);
    const tampered = Buffer.from(original);
    tampered[100] = (tampered[100] ?? 0) ^ 1;
    writeFileSync(victim, tampered);
    await expect(store.pull("spack2", second.digest, nothing, read)).rejects.toThrow(/does not match the published/);
    expect(readdirSync(join(root, "work"))).toEqual([]);
    // A consumer that stops early (tar at its end marker) has its result undone once the rest fails the digest.
    const undone: string[] = [];
    const firstPiece = async (data: AsyncIterable<Uint8Array>) => {
      for await (const _ of data) return "stopped early";
      return "nothing read";
    };
    const undo = async (result: string) => {
      undone.push(result);
    };
    await expect(store.pull("spack2", second.digest, nothing, firstPiece, undo)).rejects.toThrow(
      /does not match the published/,
    );
    expect(undone).toEqual(["stopped early"]);
    writeFileSync(victim, original);
    expect((await store.pull("spack2", second.digest, nothing, firstPiece, undo)).result).toBe("stopped early");
    expect(undone).toEqual(["stopped early"]);
    // A base that has little in common with the new part is dropped: one pack, nothing stale kept alive.
    const other = randomBytes(2 << 20);
    const third = await store.publish("spack3", parts(other), { base: "spack2" });
    expect(third.uploadedBytes).toBeGreaterThanOrEqual(other.length);
    const thirdEntry = (JSON.parse(readFileSync(join(storeDir, "index.json"), "utf8")) as typeof index).manifests.find(
      (m) => m.annotations?.["org.opencontainers.image.ref.name"] === "spack3",
    );
    expect(
      (JSON.parse(readFileSync(blob(thirdEntry?.digest ?? ""), "utf8")) as { layers: unknown[] }).layers,
    ).toHaveLength(2);
    expect((await store.pull("spack3", third.digest, nothing, read)).result.equals(other)).toBe(true);
    // An unknown base is no base.
    const fourth = await store.publish("spack4", parts(memory), { base: "snothere" });
    expect((await store.pull("spack4", fourth.digest, nothing, read)).result.equals(memory)).toBe(true);
    for (const id of ["spack2", "spack3", "spack4"]) await store.unpublish(id);
  });

  it("a publish whose part fails part way leaves no pack, no tag and nothing in the store's root", async () => {
    const failing: SnapshotParts = {
      own: async function* () {
        yield randomBytes(1 << 20);
        throw new Error("the export broke");
      },
      layers: [],
      layer: () => bytes(""),
    };
    const before = blobs();
    await expect(store.publish("sbroken", failing, {})).rejects.toThrow(/the export broke/);
    expect(await store.listPublished()).not.toContain("sbroken");
    expect(blobs()).toBe(before);
    expect(readdirSync(storeDir).filter((name) => name.startsWith(".pack-") || name.startsWith(".incoming-"))).toEqual(
      [],
    );
  });

  it("pulls an own part published as one layer (a store written before chunks)", async () => {
    const oci = new OciStore({ url: `oci:${storeDir}`, insecure: false }, join(root, "work"));
    const legacy = await oci.push("slegacy", bytes("one layer of everything"), () => ({
      "dev.warren.snapshot": "slegacy",
    }));
    expect((await store.pull("slegacy", legacy.digest, nothing, collect)).result).toBe("one layer of everything");
    await store.unpublish("slegacy");
  });

  it("collects the layers no published snapshot stacks, after their grace", async () => {
    await store.unpublish("spause");
    // lsandbox and ltamper are no one's now; lbase is still sbase's. A young layer stays within its grace.
    expect(await store.collectLayers(60_000)).toEqual([]);
    expect((await store.collectLayers(0)).sort()).toEqual(["lsandbox", "ltamper"]);
    await store.unpublish("sbase");
    expect(await store.collectLayers(0)).toEqual(["lbase"]);
    expect(await store.collectLayers(0)).toEqual([]);
  });
});
