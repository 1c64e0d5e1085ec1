import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { silentLogger } from "@warren/platform/log";
import { afterAll, describe, expect, it } from "vitest";
import { LayerStore } from "./layer-store.js";

// Real files, real tar, real xattrs (the tests run as root, like the node agent): what a snapshot layer must keep
// for overlayfs to read it as a lower layer, and what an import must refuse.
const root = mkdtempSync(join(tmpdir(), "warren-layers-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const resources = { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 };

/** An overlay upper dir as overlayfs leaves it: a file, a whiteout (0:0 char device), an opaque dir. */
function upperDir(name: string): string {
  const dir = join(root, name);
  mkdirSync(join(dir, "etc", "apt"), { recursive: true });
  writeFileSync(join(dir, "etc", "notes"), "kept");
  execFileSync("mknod", [join(dir, "etc", "issue"), "c", "0", "0"]);
  execFileSync("setfattr", ["-n", "trusted.overlay.opaque", "-v", "y", join(dir, "etc", "apt")]);
  execFileSync("chown", ["-R", "100000:100000", dir]);
  return dir;
}

async function store(name: string): Promise<LayerStore> {
  const s = new LayerStore(join(root, name), silentLogger);
  await s.start();
  return s;
}

async function* bytes(...chunks: string[]): AsyncIterable<Uint8Array> {
  for (const chunk of chunks) yield Buffer.from(chunk);
}

describe("LayerStore", () => {
  it("a captured layer keeps owners, whiteouts and opaque dirs, also after export and import elsewhere", async () => {
    const a = await store("node-a");
    const snapshot = await a.capture("s1", {
      templateId: "base",
      templateHash: "h1",
      resources,
      upperDir: upperDir("upper-1"),
      layers: [],
    });
    expect(snapshot).toMatchObject({ snapshotId: "s1", memory: false, templateId: "base" });
    expect(snapshot.sizeBytes).toBeGreaterThan(0);
    const b = await store("node-b");
    const chunks: Uint8Array[] = [];
    for await (const chunk of a.export("s1")) chunks.push(chunk);
    const imported = await b.import(
      "s1",
      (async function* () {
        yield* chunks;
      })(),
    );
    expect(imported.layers).toHaveLength(1);
    for (const layer of [...snapshot.layers, ...imported.layers]) {
      expect(readFileSync(join(layer, "etc", "notes"), "utf8")).toBe("kept");
      expect(
        execFileSync("stat", ["-c", "%F %t:%T %u", join(layer, "etc", "issue")], { encoding: "utf8" }).trim(),
      ).toBe("character special file 0:0 100000");
      expect(
        execFileSync("getfattr", ["--only-values", "-n", "trusted.overlay.opaque", join(layer, "etc", "apt")], {
          encoding: "utf8",
        }),
      ).toBe("y");
    }
    expect(imported.layers[0]?.startsWith(join(root, "node-b", "layers"))).toBe(true);
    expect((await b.list()).map((s) => s.snapshotId)).toEqual(["s1"]);
  });

  it("refuses an import that is not a tar of that snapshot, and leaves nothing behind", async () => {
    const b = await store("node-b");
    await expect(b.import("s2", bytes("not a tar stream at all"))).rejects.toThrow(/unpacking snapshot 's2' failed/);
    const a = await store("node-a");
    const chunks: Uint8Array[] = [];
    for await (const chunk of a.export("s1")) chunks.push(chunk);
    await expect(
      b.import(
        "s3",
        (async function* () {
          yield* chunks;
        })(),
      ),
    ).rejects.toThrow();
    expect((await b.list()).map((s) => s.snapshotId)).toEqual(["s1"]);
    expect(readdirSync(join(root, "node-b", "snapshots")).filter((n) => n.startsWith("."))).toEqual([]);
    await expect(b.import("../x", bytes(""))).rejects.toThrow(/invalid snapshot id/);
    await expect(
      b.capture("bad/id", { templateId: "t", templateHash: "h", resources, upperDir: root, layers: [] }),
    ).rejects.toThrow(/invalid snapshot id/);
  });

  it("collect keeps layers a snapshot, a live instance or a create in progress uses, and removes the rest", async () => {
    const c = await store("node-c");
    const first = await c.capture("base-snap", {
      templateId: "base",
      templateHash: "h1",
      resources,
      upperDir: upperDir("upper-2"),
      layers: [],
    });
    // A sandbox made from it, then snapshotted again: two stacked layers.
    const second = await c.capture("child-snap", {
      templateId: "base",
      templateHash: "h1",
      resources,
      upperDir: upperDir("upper-3"),
      layers: first.layers,
    });
    expect(second.layers).toHaveLength(2);
    expect(second.layers[1]).toBe(first.layers[0]);

    await c.delete("base-snap");
    await c.collect(() => []);
    // Still stacked under child-snap.
    expect(existsSync(first.layers[0] ?? "")).toBe(true);

    const pinned = await c.pin("child-snap");
    await c.delete("child-snap");
    await c.collect(() => []);
    expect(second.layers.every((layer) => existsSync(layer))).toBe(true);
    pinned.release();
    // A live instance stacking the lower layer keeps that one.
    await c.collect(() => [first.layers[0] ?? ""]);
    expect(existsSync(second.layers[0] ?? "")).toBe(false);
    expect(existsSync(first.layers[0] ?? "")).toBe(true);
    await c.collect(() => []);
    expect(readdirSync(join(root, "node-c", "layers"))).toEqual([]);
    await expect(c.pin("child-snap")).rejects.toThrow(/unknown snapshot 'child-snap'/);
  });

  it("moves only the layers the receiver lacks: an export without them, their own streams after it", async () => {
    const d = await store("node-d");
    const base = await d.capture("tpl", {
      templateId: "base",
      templateHash: "h1",
      resources,
      upperDir: upperDir("upper-4"),
      layers: [],
    });
    const child = await d.capture("paused", {
      templateId: "base",
      templateHash: "h1",
      resources,
      upperDir: upperDir("upper-5"),
      layers: base.layers,
    });
    const [own, shared] = (await d.layerNames("paused")) ?? [];
    expect(await d.layerNames("paused")).toEqual(child.layers.map((l) => l.split("/").at(-1)));
    expect((await d.localLayers()).sort()).toEqual([own, shared].sort());
    const read = async (data: AsyncIterable<Uint8Array>) => {
      const chunks: Uint8Array[] = [];
      for await (const chunk of data) chunks.push(chunk);
      return Buffer.concat(chunks);
    };
    const full = await read(d.export("paused"));
    const lean = await read(d.export("paused", new Set([shared ?? ""])));
    expect(lean.length).toBeLessThan(full.length);
    // The same layer makes the same bytes each time (the store checks a layer pushed once by its digest).
    expect((await read(d.exportLayer(shared ?? ""))).equals(await read(d.exportLayer(shared ?? "")))).toBe(true);

    // A node without the template's layer cannot import the lean stream alone, and keeps nothing of it…
    const e = await store("node-e");
    const leanOnly = async function* () {
      yield lean;
    };
    await expect(e.import("paused", leanOnly())).rejects.toThrow(
      new RegExp(`layer '${shared}' of snapshot 'paused' is neither in the stream nor on this node`),
    );
    expect(await e.localLayers()).toEqual([]);
    // …but can with the layer's own stream after it (tar archives one after the other).
    const layer = await read(d.exportLayer(shared ?? ""));
    const imported = await e.import(
      "paused",
      (async function* () {
        yield lean;
        yield layer;
      })(),
    );
    expect(imported.layers.map((l) => l.split("/").at(-1))).toEqual([own, shared]);
    expect(readFileSync(join(imported.layers[1] ?? "", "etc", "notes"), "utf8")).toBe("kept");
    // A node that has the layer imports the lean stream alone.
    await e.delete("paused");
    const again = await e.import("paused", leanOnly());
    expect(again.layers).toEqual(imported.layers);
    await expect(read(d.exportLayer("l0000000000000000"))).rejects.toThrow(/not on this node/);
  });

  it("an incremental capture writes only what changed, above the previous capture of the same writable layer", async () => {
    const f = await store("node-f");
    const upper = upperDir("upper-6");
    writeFileSync(join(upper, "big"), Buffer.alloc(1 << 20, 7));
    const manifestDir = join(root, "captures-6");
    mkdirSync(manifestDir);
    const source = { templateId: "base", templateHash: "h1", resources, upperDir: upper, layers: [] };
    // Past the window within which a file written just before a capture is copied again by the next one.
    await sleep(300);
    const first = await f.capture("inc-1", { ...source, incremental: { manifestDir } });
    expect(first.layers).toHaveLength(1);
    writeFileSync(join(upper, "etc", "notes"), "changed");
    const second = await f.capture("inc-2", { ...source, incremental: { manifestDir, previous: first.layers } });
    // Stacked above the first; the unchanged 1 MiB file is not copied again.
    expect(second.layers.slice(1)).toEqual(first.layers);
    expect(existsSync(join(second.layers[0] ?? "", "big"))).toBe(false);
    expect(readFileSync(join(second.layers[0] ?? "", "etc", "notes"), "utf8")).toBe("changed");
    expect(second.sizeBytes).toBeLessThan(first.sizeBytes / 4);
    // Without the previous capture's manifest (or past the chain's depth), a capture copies everything again.
    rmSync(join(manifestDir, `${first.layers[0]?.split("/").at(-1)}.manifest`));
    const third = await f.capture("inc-3", { ...source, incremental: { manifestDir, previous: first.layers } });
    expect(third.layers).toHaveLength(1);
    expect(existsSync(join(third.layers[0] ?? "", "big"))).toBe(true);
  });
});
