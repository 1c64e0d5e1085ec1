import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import { LayerStore, type MemoryImage } from "../runtime/namespace/layer-store.js";
import { silentLogger } from "./log.js";
import { SnapshotPublishing } from "./snapshot-publishing.js";

// Two nodes' layer stores (real layers, tar, skopeo and an OCI layout directory as the cluster's store): a sandbox
// paused twice publishes only what changed each time, and a node that holds the layers under a snapshot pulls only
// the rest. The node's snapshots are the layer store itself, as the namespace driver offers it.
const root = mkdtempSync(join(tmpdir(), "warren-publishing-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const resources = { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 };
const MiB = 2 ** 20;

async function node(name: string): Promise<{ layers: LayerStore; publishing: SnapshotPublishing }> {
  const stateDir = join(root, name);
  const layers = new LayerStore(stateDir, silentLogger);
  await layers.start();
  const snapshots = {
    export: async (id: string, omit?: ReadonlySet<string>) => layers.export(id, omit),
    import: (id: string, data: AsyncIterable<Uint8Array>) => layers.import(id, data),
    delete: (id: string) => layers.delete(id),
    list: () => layers.list(),
    layers: {
      layersOf: (id: string) => layers.layerNames(id),
      localLayers: () => layers.localLayers(),
      exportLayer: (layer: string) => layers.exportLayer(layer),
    },
  };
  const publishing = new SnapshotPublishing(
    { stateDir, store: { url: `oci:${join(root, "store")}`, insecure: false } },
    snapshots,
    silentLogger,
  );
  return { layers, publishing };
}

describe("publishing snapshots with shared layers", () => {
  it("a second pause publishes only what changed; a node with the lower layers pulls only the rest", async () => {
    const a = await node("node-a");
    const upper = join(root, "upper");
    mkdirSync(join(upper, "home"), { recursive: true });
    writeFileSync(join(upper, "home", "big"), Buffer.alloc(4 * MiB, 1));
    // Past the window in which a file written just before a capture is copied again by the next one.
    await sleep(300);
    const source = { templateId: "base", templateHash: "h", resources, upperDir: upper, layers: [] };
    const manifestDir = join(root, "captures");
    mkdirSync(manifestDir);
    const first = await a.layers.capture("pause1", { ...source, incremental: { manifestDir } });
    const one = await a.publishing.publish("pause1", { kind: "durable" });
    expect(one.uploadedBytes).toBeGreaterThan(4 * MiB);

    writeFileSync(join(upper, "home", "note"), "written after the first pause");
    await a.layers.capture("pause2", { ...source, incremental: { manifestDir, previous: first.layers } });
    const two = await a.publishing.publish("pause2", { kind: "durable" });
    // Its own part and the new diff layer: kilobytes, while the snapshot is still the whole 4 MiB and more.
    expect(two.sizeBytes).toBeGreaterThan(4 * MiB);
    expect(two.uploadedBytes).toBeLessThan(64 * 1024);

    // Node b pulls the first pause (everything), then the second: only what it lacks.
    const b = await node("node-b");
    const pulledFirst = await b.publishing.pull("pause1", one.digest);
    expect(pulledFirst.downloadedBytes).toBeGreaterThan(4 * MiB);
    const pulledSecond = await b.publishing.pull("pause2", two.digest);
    expect(pulledSecond.downloadedBytes).toBeLessThan(64 * 1024);
    const [top, below] = (await b.layers.layerNames("pause2")) ?? [];
    expect(below).toBe((await b.layers.layerNames("pause1"))?.[0]);
    // The stack on node b reads as the sandbox did: the big file from the first layer, the note from the second.
    const merged = join(root, "merged");
    mkdirSync(merged);
    const layerDir = (name: string | undefined) => join(root, "node-b", "layers", name ?? "");
    execFileSync("mount", ["-t", "overlay", "-o", `lowerdir=${layerDir(top)}:${layerDir(below)}`, "none", merged]);
    try {
      expect(readFileSync(join(merged, "home", "note"), "utf8")).toBe("written after the first pause");
      expect(readFileSync(join(merged, "home", "big")).length).toBe(4 * MiB);
    } finally {
      execFileSync("umount", [merged]);
    }
    // A node that has it answers at once.
    expect((await b.publishing.pull("pause2", two.digest)).downloadedBytes).toBe(0);
  });

  it("packs memory against its base, and reads the part again from the node when the base has too little of it", async () => {
    const c = await node("node-c");
    const upper = join(root, "upper-c");
    mkdirSync(upper, { recursive: true });
    const source = { templateId: "base", templateHash: "h", resources, upperDir: upper, layers: [] };
    // A stand-in for CRIU's images: the store sees files in the snapshot's memory folder, whatever wrote them.
    const withPages = (pages: Buffer) => async (imagesDir: string) => {
      mkdirSync(imagesDir, { recursive: true });
      writeFileSync(join(imagesDir, "pages-1.img"), pages);
      return { bootId: "boot" } as unknown as MemoryImage;
    };
    const pages = randomBytes(3 * MiB);
    await c.layers.capture("mem1", source, withPages(pages));
    const one = await c.publishing.publish("mem1", { kind: "durable" });
    expect(one.uploadedBytes).toBeGreaterThan(3 * MiB);
    // A few pages changed: packed against the first, it moves them (and its index), not the 3 MiB.
    const changed = Buffer.from(pages);
    changed.fill(7, MiB, MiB + 8192);
    await c.layers.capture("mem2", source, withPages(changed));
    const two = await c.publishing.publish("mem2", { kind: "durable", base: "mem1" });
    expect(two.uploadedBytes).toBeLessThan(256 * 1024);
    // Memory that has moved on (a little of it still in the base's 3 MiB pack, which it would keep alive): the
    // base is dropped, and the part is read from the node a second time, whole.
    const other = Buffer.concat([pages.subarray(0, 256 * 1024), randomBytes(3 * MiB - 256 * 1024)]);
    await c.layers.capture("mem3", source, withPages(other));
    const three = await c.publishing.publish("mem3", { kind: "durable", base: "mem2" });
    expect(three.uploadedBytes).toBeGreaterThan(3 * MiB);
    const d = await node("node-d");
    for (const [id, digest, expected] of [
      ["mem2", two.digest, changed],
      ["mem3", three.digest, other],
    ] as const) {
      await d.publishing.pull(id, digest);
      expect(readFileSync(join(root, "node-d", "snapshots", id, "memory", "pages-1.img")).equals(expected)).toBe(true);
    }
  });
});
