import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { basename, join, relative } from "node:path";
import type { Logger } from "@warren/platform/log";
import { isSnapshotId } from "@warren/proto/redis";
import { type SandboxResources, type SnapshotImage, withCurrentResourceNames } from "../driver.js";
import { exec } from "../exec.js";
import { TAR_KEEP, tarCreateStream, tarExtractStream } from "../tar-stream.js";
import type { CriuExternalFiles } from "./criu.js";
import { captureUpper } from "./layer-diff.js";

/** A CRIU dump kept with a snapshot (`snapshots/<id>/memory/`): what a restore into a new instance needs. */
export interface MemoryImage extends CriuExternalFiles {
  /** The source's boot id: a memory copy continues the same boot. */
  readonly bootId: string;
}

/** What the namespace driver keeps per snapshot: the public description and the layers an instance stacks. */
export interface LayeredSnapshot extends SnapshotImage {
  /** Layer directories, topmost first, that go above the template's rootfs (overlayfs lower dirs). */
  readonly layers: readonly string[];
  /** Set when the snapshot holds the processes too (`memory`). */
  readonly criu?: MemoryImage;
}

export interface CaptureSource {
  readonly templateId: string;
  readonly templateHash: string;
  readonly resources: SandboxResources;
  /** The instance's overlay upper dir (its writable layer). */
  readonly upperDir: string;
  /** The layers the instance already stacks on its template (it may itself come from a snapshot). */
  readonly layers: readonly string[];
  /**
   * Incremental captures (layer-diff.ts): the previous capture of this same writable layer (its snapshot's whole
   * stack, topmost first; undefined before the first) and the folder where captures keep their manifests. The new
   * layer then holds only what changed since, stacked above the previous capture's.
   */
  readonly incremental?: { readonly previous?: readonly string[]; readonly manifestDir: string };
}

/**
 * overlayfs takes its lower dirs as one mount option string, which the legacy mount API limits to a page: a
 * chain of snapshots of snapshots stops well before that (each layer path is about 80 bytes).
 */
export const MAX_LAYERS = 32;

const LAYER_NAME = /^l[0-9a-f]{16}$/;
/**
 * How deep a chain of incremental captures of one sandbox may grow before a capture copies its whole writable
 * layer again: below MAX_LAYERS, so sandboxes made from the last capture can still be snapshotted a few times.
 */
export const MAX_CAPTURE_CHAIN = 24;
/**
 * The same layer always makes the same bytes (the store names a layer by name once and checks it by digest, and
 * two nodes may push one): entries by name, no access or change times, no pid in pax header names.
 */
const TAR_REPRODUCIBLE = ["--sort=name", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"];

/**
 * Snapshots of namespace sandboxes as overlayfs layers on the node's disk. A snapshot copies the sandbox's
 * writable layer (a tmpfs) into an immutable layer directory; sandboxes started from it stack that layer, and the
 * layers it was itself made on, between their own new writable layer and the template's rootfs: O(1) to start,
 * one copy on disk and in the page cache however many sandboxes use it.
 *
 * Layers outlive the snapshot that made them while a sandbox still stacks them (E2B: deleting a snapshot never
 * breaks the sandboxes made from it): `collect` deletes a layer once neither a snapshot nor a live instance refers
 * to it. It runs after every delete and kill and at start, so a crash at any point leaves at most garbage that the
 * next run removes, never a missing layer.
 *
 * Memory is not kept: that needs CRIU, which this driver uses only for pause, where it has been verified to work
 * (RUNTIME-NOTES §2.8); a snapshot here is the filesystem, and its sandboxes boot fresh over it.
 */
export class LayerStore {
  private readonly snapshotsDir: string;
  private readonly layersDir: string;
  /** Layers a create is stacking right now (before its instance record exists). */
  private readonly pinned = new Map<string, number>();

  constructor(
    stateDir: string,
    private readonly log: Logger,
  ) {
    this.snapshotsDir = join(stateDir, "snapshots");
    this.layersDir = join(stateDir, "layers");
  }

  async start(): Promise<void> {
    await mkdir(this.snapshotsDir, { recursive: true });
    await mkdir(this.layersDir, { recursive: true });
    // Half-made snapshots and layers of a crashed capture.
    for (const dir of [this.snapshotsDir, this.layersDir])
      for (const name of await readdir(dir)) if (name.startsWith(".")) await rm(join(dir, name), { recursive: true });
  }

  /**
   * Copies `source.upperDir` into a new layer and records the snapshot. The caller keeps the sandbox still
   * (frozen) meanwhile. The copy keeps what overlayfs put there: uid-shifted owners, modes, xattrs (opaque dirs)
   * and whiteouts (0:0 character devices), which overlayfs honours in lower layers too. With `incremental`, a
   * capture after the first copies only what changed since the previous one (a template build's later steps, a
   * sandbox paused again), as a layer above that capture's. With `dumpMemory`, the processes are dumped next to it
   * (after the files, from the same frozen moment).
   */
  async capture(
    snapshotId: string,
    source: CaptureSource,
    dumpMemory?: (imagesDir: string) => Promise<MemoryImage>,
  ): Promise<LayeredSnapshot> {
    if (!isSnapshotId(snapshotId)) throw new Error(`invalid snapshot id '${snapshotId}'`);
    if (existsSync(join(this.snapshotsDir, snapshotId))) throw new Error(`snapshot '${snapshotId}' already exists`);
    if (source.layers.length + 1 > MAX_LAYERS) {
      throw new Error(`a sandbox made from ${source.layers.length} stacked snapshots cannot be snapshotted again`);
    }
    const layerId = `l${randomBytes(8).toString("hex")}`;
    const tmpLayer = join(this.layersDir, `.${layerId}`);
    const tmpMeta = join(this.snapshotsDir, `.${snapshotId}-${layerId}`);
    const { previous, manifestDir } = source.incremental ?? {};
    // The previous capture's manifest is named after its top layer: only kept with that layer's stack.
    const stacked =
      previous?.[0] !== undefined &&
      previous.length < MAX_CAPTURE_CHAIN &&
      previous.every((layer) => existsSync(layer)) &&
      manifestDir !== undefined;
    const manifestFile = manifestDir ? join(manifestDir, `${layerId}.manifest`) : undefined;
    this.hold(previous ?? []);
    try {
      let below = source.layers;
      if (manifestFile) {
        const captured = await captureUpper({
          upperDir: source.upperDir,
          layerDir: tmpLayer,
          manifestFile,
          ...(stacked ? { previousManifestFile: join(manifestDir, `${basename(previous[0] ?? "")}.manifest`) } : {}),
        });
        // A full copy holds the whole writable layer: it goes right above what the instance was made from.
        if (captured.kind === "diff" && previous) below = previous;
      } else {
        await exec("cp", ["-a", "--", source.upperDir, tmpLayer]);
      }
      await mkdir(tmpMeta, { mode: 0o755 });
      const criu = dumpMemory ? await dumpMemory(join(tmpMeta, "memory")) : undefined;
      // `du -c` ends with the total of the layer and the description (with its memory images).
      const total = (await exec("du", ["-scb", "--", tmpLayer, tmpMeta])).stdout.trim().split("\n").at(-1) ?? "";
      const sizeBytes = Number(total.split("\t")[0]) || 0;
      const layer = join(this.layersDir, layerId);
      const snapshot: LayeredSnapshot = {
        snapshotId,
        driver: "namespace",
        templateId: source.templateId,
        templateHash: source.templateHash,
        memory: criu !== undefined,
        resources: source.resources,
        sizeBytes,
        createdAt: Date.now(),
        layers: [layer, ...below],
        ...(criu ? { criu } : {}),
      };
      await writeFile(join(tmpMeta, "snapshot.json"), JSON.stringify(snapshot));
      // Layer first (pinned, so a collect in between keeps it): a crash between the two renames leaves an
      // unreferenced layer, which the next collect removes.
      this.hold([layer]);
      try {
        await rename(tmpLayer, layer);
        await rename(tmpMeta, join(this.snapshotsDir, snapshotId));
      } finally {
        this.unhold([layer]);
      }
      return snapshot;
    } catch (error) {
      await rm(tmpLayer, { recursive: true, force: true });
      await rm(tmpMeta, { recursive: true, force: true });
      if (manifestFile) await rm(manifestFile, { force: true });
      throw error;
    } finally {
      this.unhold(previous ?? []);
    }
  }

  async get(snapshotId: string): Promise<LayeredSnapshot | undefined> {
    if (!isSnapshotId(snapshotId)) return undefined;
    try {
      const snapshot = withCurrentResourceNames(
        JSON.parse(await readFile(join(this.snapshotsDir, snapshotId, "snapshot.json"), "utf8")) as LayeredSnapshot,
      );
      return snapshot.layers.every((layer) => existsSync(layer)) ? snapshot : undefined;
    } catch {
      return undefined;
    }
  }

  async list(): Promise<LayeredSnapshot[]> {
    const names = existsSync(this.snapshotsDir) ? await readdir(this.snapshotsDir) : [];
    const found = await Promise.all(names.filter((n) => !n.startsWith(".")).map((name) => this.get(name)));
    return found.filter((s): s is LayeredSnapshot => s !== undefined);
  }

  /** Holds a snapshot's layers for a create until its instance record refers to them. */
  async pin(snapshotId: string): Promise<{ snapshot: LayeredSnapshot; release: () => void }> {
    const snapshot = await this.get(snapshotId);
    if (!snapshot) throw new Error(`unknown snapshot '${snapshotId}'`);
    this.hold(snapshot.layers);
    let released = false;
    return {
      snapshot,
      release: () => {
        if (released) return;
        released = true;
        this.unhold(snapshot.layers);
      },
    };
  }

  private hold(layers: readonly string[]): void {
    for (const layer of layers) this.pinned.set(layer, (this.pinned.get(layer) ?? 0) + 1);
  }

  private unhold(layers: readonly string[]): void {
    for (const layer of layers) {
      const left = (this.pinned.get(layer) ?? 1) - 1;
      if (left > 0) this.pinned.set(layer, left);
      else this.pinned.delete(layer);
    }
  }

  /** Where a memory snapshot's CRIU images are. */
  memoryDir(snapshotId: string): string {
    return join(this.snapshotsDir, snapshotId, "memory");
  }

  async delete(snapshotId: string): Promise<void> {
    if (!isSnapshotId(snapshotId)) return;
    await rm(join(this.snapshotsDir, snapshotId), { recursive: true, force: true });
  }

  /** The names of the snapshot's layers, topmost first (undefined for an unknown snapshot). */
  async layerNames(snapshotId: string): Promise<string[] | undefined> {
    return (await this.get(snapshotId))?.layers.map((layer) => basename(layer));
  }

  /** The names of every layer on this node. */
  async localLayers(): Promise<string[]> {
    const names = existsSync(this.layersDir) ? await readdir(this.layersDir) : [];
    return names.filter((name) => LAYER_NAME.test(name));
  }

  /**
   * The snapshot as a tar stream: `snapshots/<id>/` (its description and memory) and each of its layers as
   * `layers/<name>/` (paths relative to the state dir) but those in `omitLayers` (the receiver has them, or gets
   * them separately from `exportLayer`), for `import` on another node. The layers stay pinned while it streams.
   */
  async *export(snapshotId: string, omitLayers: ReadonlySet<string> = new Set()): AsyncIterable<Uint8Array> {
    const { snapshot, release } = await this.pin(snapshotId);
    try {
      const root = join(this.layersDir, "..");
      const members = [
        relative(root, join(this.snapshotsDir, snapshotId)),
        ...snapshot.layers.filter((layer) => !omitLayers.has(basename(layer))).map((layer) => relative(root, layer)),
      ];
      yield* tarCreate(root, members, `snapshot '${snapshotId}'`);
    } finally {
      release();
    }
  }

  /** One layer as a tar stream (`layers/<name>/`), which `import` reads after an export that omitted it. */
  async *exportLayer(name: string): AsyncIterable<Uint8Array> {
    const layer = join(this.layersDir, name);
    if (!LAYER_NAME.test(name) || !existsSync(layer)) throw new Error(`layer '${name}' is not on this node`);
    this.hold([layer]);
    try {
      yield* tarCreate(join(this.layersDir, ".."), [relative(join(this.layersDir, ".."), layer)], `layer '${name}'`);
    } finally {
      this.unhold([layer]);
    }
  }

  /**
   * Stores a stream `export` made on another node, possibly followed by `exportLayer` streams (tar archives one
   * after the other: read with `--ignore-zeros`). Its layers keep their names (random, so the same name is the
   * same content: a layer this node already has is kept and the copy dropped); a layer the stream left out must be
   * on this node already. The description is rewritten to this node's paths. Extracted into a hidden directory
   * first: a failure leaves nothing.
   */
  async import(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<LayeredSnapshot> {
    if (!isSnapshotId(snapshotId)) throw new Error(`invalid snapshot id '${snapshotId}'`);
    if (existsSync(join(this.snapshotsDir, snapshotId))) throw new Error(`snapshot '${snapshotId}' already exists`);
    const tmp = join(this.snapshotsDir, `.import-${snapshotId}-${randomBytes(4).toString("hex")}`);
    await mkdir(tmp);
    const moved: string[] = [];
    try {
      await tarExtractStream(
        ["--ignore-zeros", ...TAR_KEEP, "--same-owner", "--same-permissions", "-C", tmp],
        data,
        `snapshot '${snapshotId}'`,
      );
      const source = withCurrentResourceNames(
        JSON.parse(await readFile(join(tmp, "snapshots", snapshotId, "snapshot.json"), "utf8")) as LayeredSnapshot,
      );
      const names = source.layers.map((layer) => basename(layer));
      if (source.snapshotId !== snapshotId || names.some((name) => !LAYER_NAME.test(name))) {
        throw new Error(`the stream does not hold snapshot '${snapshotId}'`);
      }
      const snapshot: LayeredSnapshot = { ...source, layers: names.map((name) => join(this.layersDir, name)) };
      this.hold(snapshot.layers);
      try {
        for (const name of names) {
          const target = join(this.layersDir, name);
          if (existsSync(target)) continue;
          if (!existsSync(join(tmp, "layers", name))) {
            throw new Error(`layer '${name}' of snapshot '${snapshotId}' is neither in the stream nor on this node`);
          }
          await rename(join(tmp, "layers", name), target);
          moved.push(target);
        }
        await writeFile(join(tmp, "snapshots", snapshotId, "snapshot.json"), JSON.stringify(snapshot));
        await rename(join(tmp, "snapshots", snapshotId), join(this.snapshotsDir, snapshotId));
      } finally {
        this.unhold(snapshot.layers);
      }
      return snapshot;
    } catch (error) {
      for (const layer of moved) await rm(layer, { recursive: true, force: true });
      throw error;
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }

  /** Deletes every layer that no snapshot, no pinned create and none of `inUse` (live instances' layers) needs. */
  async collect(inUse: () => Iterable<string>): Promise<void> {
    // Layers first, references after: a layer that appears in between is not in `names`, and one that appeared
    // before is pinned by its capture until its snapshot is listed.
    const names = existsSync(this.layersDir) ? await readdir(this.layersDir) : [];
    const keep = new Set(inUse());
    for (const layer of this.pinned.keys()) keep.add(layer);
    for (const snapshot of await this.list()) for (const layer of snapshot.layers) keep.add(layer);
    for (const name of names) {
      const layer = join(this.layersDir, name);
      if (name.startsWith(".") || keep.has(layer)) continue;
      this.log.debug("removing an unused snapshot layer", { layer });
      await rm(layer, { recursive: true, force: true });
    }
  }
}

/** `tar --create` of `members` under `root` as a stream, reproducibly (the same layer always makes the same bytes). */
function tarCreate(root: string, members: readonly string[], what: string): AsyncIterable<Uint8Array> {
  return tarCreateStream([...TAR_KEEP, ...TAR_REPRODUCIBLE, "-C", root, "--", ...members], what);
}
