import { createHash } from "node:crypto";
import { join } from "node:path";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";
import { type BlobRef, OciStore, type OciStoreConfig } from "./oci-store.js";
import type { PackCache } from "./pack-cache.js";
import type { PartReader } from "./part-readers.js";
import { SHIPPED_TEMPLATE_TAG_PREFIX } from "./shipped-templates.js";
import { mismatch } from "./snapshot-packs.js";

/**
 * Where snapshots (built templates, durable pauses, team snapshots) live beyond the node that made them, so every
 * node can start sandboxes of them:
 *  - `oci:<dir>`: an OCI image layout in a directory (the embedded default: one node, or a filesystem the nodes
 *    share);
 *  - `docker://<host>[:port]/<path>`: an OCI registry (any registry a platform team runs; Debian's
 *    `docker-registry` in tests).
 *
 * A snapshot is stored as parts, each an OCI image checked by digest:
 *  - its **own part**, tagged with the snapshot id: the driver's export stream without the shared layers (the
 *    snapshot's description, its memory), Warren's description in the config's labels; its layers are an index
 *    and packs of content-defined units (snapshot-packs.ts), packed against the same sandbox's previous publish:
 *    a sandbox paused again adds the units that changed, not its whole memory;
 *  - its **shared layers** (a driver's immutable snapshot layers, named once for all), each tagged
 *    `layer.<name>` and pushed only when the store does not have it: a sandbox's pause publishes its own files,
 *    not the template's under them, and a rebuilt template only its changed steps.
 * The own part's config carries the parts list (each part's name, digest and size) as one label, and the digest
 * answered for the snapshot is that label's sha256: a pulling node checks the label against the digest the master
 * recorded, then every part it pulls against the list, so a re-tagged or corrupted part is never imported. A
 * snapshot published before parts existed (one image of the whole export, no list) is checked as it was: its one
 * layer against the digest.
 */
export type SnapshotStoreConfig = OciStoreConfig;

export interface PublishedSnapshot {
  /** `sha256:<hex>` of the snapshot's parts list (or, for a snapshot of one part, of that part). */
  readonly digest: string;
  /** All of its parts. */
  readonly sizeBytes: number;
  /** What this publish moved: the parts the store did not have. */
  readonly uploadedBytes: number;
}

/** A snapshot as the store takes it. */
export interface SnapshotParts {
  /** The snapshot's own part (description, memory, anything not in `layers`) as one byte stream. */
  readonly own: () => AsyncIterable<Uint8Array>;
  /** Its shared layers, topmost first (none for a driver without them). */
  readonly layers: readonly string[];
  readonly layer: (name: string) => AsyncIterable<Uint8Array>;
}

/** The label on a snapshot's own part that lists its parts; its sha256 is the snapshot's published digest. */
const PARTS_LABEL = "dev.warren.parts";
const LAYER_LABEL = "dev.warren.layer";
const LAYER_TAG_PREFIX = "layer.";
const LAYER_NAME = /^[A-Za-z0-9_-]{1,100}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

interface PartsList {
  readonly own: BlobRef;
  readonly layers: readonly (BlobRef & { readonly name: string })[];
}

export class SnapshotStore {
  private readonly oci: OciStore;

  constructor(
    config: SnapshotStoreConfig,
    workDir: string,
    private readonly log: Logger,
    packCache?: PackCache,
  ) {
    this.oci = new OciStore(config, workDir, packCache);
  }

  /** A readable description of the store (never its credentials). */
  get description(): string {
    return this.oci.description;
  }

  /**
   * Publishes a snapshot under its id: the shared layers the store lacks first, its own part (with the parts
   * list) last, so a snapshot tag only ever names parts that are there.
   */
  async publish(
    snapshotId: string,
    parts: SnapshotParts,
    labels: Readonly<Record<string, string>>,
  ): Promise<PublishedSnapshot> {
    const started = performance.now();
    const tags = new Set(await this.oci.listTags());
    const layers: (BlobRef & { name: string })[] = [];
    let uploadedBytes = 0;
    for (const name of parts.layers) {
      if (!LAYER_NAME.test(name)) throw new AgentError("internal", `'${name}' is not a layer name`);
      const tag = `${LAYER_TAG_PREFIX}${name}`;
      const known = tags.has(tag) ? await this.layerRef(tag, name) : undefined;
      if (known) {
        layers.push({ name, ...known });
        continue;
      }
      const pushed = await this.pushLayer(name, parts);
      uploadedBytes += pushed.size;
      layers.push({ name, ...pushed });
    }
    // The own part's digest is only known once it is written: the list goes into the config after.
    let list = "";
    const ownLabels = (ownRef: BlobRef) => {
      list = JSON.stringify({ own: ownRef, layers } satisfies PartsList);
      return { ...labels, "dev.warren.snapshot": snapshotId, ...(layers.length > 0 ? { [PARTS_LABEL]: list } : {}) };
    };
    // The own part goes in as packs against the same sandbox's previous publish (`labels.base`, when the master
    // names one): a sandbox paused again moves what changed in its memory and files since (snapshot-packs.ts).
    const pushed = await this.oci.pushPacks(snapshotId, parts.own, ownLabels, labels.base);
    const own = pushed.ref;
    uploadedBytes += pushed.uploadedBytes;
    // A layer found in the store may have been collected since (no snapshot listed it while this publish ran):
    // pushed again, the same bytes (layer tars are reproducible), so the snapshot never lists a missing part.
    const after = new Set(await this.oci.listTags());
    for (const layer of layers) {
      if (after.has(`${LAYER_TAG_PREFIX}${layer.name}`)) continue;
      const again = await this.pushLayer(layer.name, parts);
      if (again.digest !== layer.digest) {
        throw new AgentError("internal", `layer '${layer.name}' changed while snapshot '${snapshotId}' was published`);
      }
      uploadedBytes += again.size;
    }
    const sizeBytes = own.size + layers.reduce((sum, layer) => sum + layer.size, 0);
    this.log.info("snapshot published", {
      snapshotId,
      store: this.oci.description,
      layers: layers.length,
      units: pushed.units,
      ...(pushed.base ? { base: pushed.base } : {}),
      sizeMiB: Math.round(sizeBytes / 2 ** 20),
      ownBytes: own.size,
      uploadedBytes,
      ms: Math.round(performance.now() - started),
    });
    // Without shared layers the snapshot is one part, and its digest is that part's, as before parts existed.
    const digest = layers.length > 0 ? `sha256:${createHash("sha256").update(list).digest("hex")}` : own.digest;
    return { digest, sizeBytes, uploadedBytes };
  }

  /** Pushes one of the snapshot's layers under `layer.<name>`, its size in a label (`layerRef` reads it back). */
  private pushLayer(name: string, parts: SnapshotParts): Promise<BlobRef> {
    return this.oci.push(`${LAYER_TAG_PREFIX}${name}`, parts.layer(name), (ref) => ({
      [LAYER_LABEL]: name,
      [`${LAYER_LABEL}.size`]: `${ref.size}`,
    }));
  }

  /** A layer the store has: its digest and size from its config (undefined when that is not Warren's). */
  private async layerRef(tag: string, name: string): Promise<BlobRef | undefined> {
    const config = await this.oci.readConfig(tag);
    const labels = config?.config?.Labels ?? {};
    const diffId = config?.rootfs?.diff_ids?.[0];
    const size = Number(labels[`${LAYER_LABEL}.size`]);
    if (labels[LAYER_LABEL] !== name || !diffId || !DIGEST.test(diffId) || !Number.isFinite(size)) return undefined;
    return { digest: diffId, size };
  }

  /**
   * The snapshot ids published to the store (its shared layers' tags and the shipped templates' are not snapshots:
   * the master's collection never sees them). A registry lists its
   * tags; a layout directory its index (an empty list when the store was never written to).
   */
  async listPublished(): Promise<string[]> {
    return (await this.oci.listTags()).filter(
      (tag) => !tag.startsWith(LAYER_TAG_PREFIX) && !tag.startsWith(SHIPPED_TEMPLATE_TAG_PREFIX),
    );
  }

  /**
   * Removes a published snapshot's own part from the store; idempotent. Its shared layers stay for
   * `collectLayers`. A layout directory drops the tag and then every blob nothing else refers to; a registry
   * deletes the manifest (its blobs go with the registry's own garbage collection, which needs
   * `storage.delete.enabled`).
   */
  async unpublish(snapshotId: string): Promise<void> {
    if (!/^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/.test(snapshotId)) {
      throw new AgentError("invalid_argument", `'${snapshotId}' is not a snapshot id`);
    }
    if (!(await this.oci.remove([snapshotId]))) return;
    this.log.info("snapshot unpublished", { snapshotId, store: this.oci.description });
  }

  /**
   * Removes the shared layers no published snapshot lists and none was pushed less than `graceMs` ago: a publish
   * in progress pushes its missing layers before its own part, and one that found a layer already there lists it
   * within the same publish. Resolves with the layer names removed.
   */
  async collectLayers(graceMs: number): Promise<string[]> {
    const tags = await this.oci.listTags();
    const listed = new Set<string>();
    for (const tag of tags) {
      if (tag.startsWith(LAYER_TAG_PREFIX)) continue;
      const config = await this.oci.readConfig(tag);
      const parts = config?.config?.Labels?.[PARTS_LABEL];
      if (!parts) continue;
      for (const layer of (JSON.parse(parts) as PartsList).layers) listed.add(layer.name);
    }
    const unused: string[] = [];
    for (const tag of tags) {
      const name = tag.slice(LAYER_TAG_PREFIX.length);
      if (!tag.startsWith(LAYER_TAG_PREFIX) || listed.has(name)) continue;
      const created = Date.parse((await this.oci.readConfig(tag))?.created ?? "");
      if (Number.isFinite(created) && Date.now() - created < graceMs) continue;
      unused.push(tag);
    }
    if (unused.length > 0) {
      await this.oci.remove(unused);
      this.log.info("unused layers removed from the store", { store: this.oci.description, layers: unused.length });
    }
    return unused.map((tag) => tag.slice(LAYER_TAG_PREFIX.length));
  }

  /**
   * Pulls a published snapshot: its own part, and the shared layers `have` says this node lacks, each checked
   * against the parts list whose digest is `digest`. `consume` (the driver's import) reads them as one stream, the
   * own part first, read from the store as it goes (no copy on disk of a layout's part); a part whose bytes do not
   * match fails the stream at its end, and one the consumer stopped reading early (tar ends at its end marker) is
   * read through and checked after: a mismatch then `undo`es what `consume` made. Scratch copies are removed
   * afterwards whatever happens.
   */
  async pull<T>(
    snapshotId: string,
    digest: string,
    have: (layer: string) => boolean,
    consume: (data: AsyncIterable<Uint8Array>) => Promise<T>,
    undo: (result: T) => Promise<void> = async () => undefined,
  ): Promise<{ result: T; downloadedBytes: number }> {
    if (!DIGEST.test(digest)) {
      throw new AgentError("invalid_argument", `digest must be sha256:<64 hex>, got '${digest}'`);
    }
    return this.oci.inScratch(`pull-${snapshotId}`, async (scratch) => {
      const started = performance.now();
      const own = await this.oci.openPart(snapshotId, join(scratch, "own"));
      const readers: { reader: PartReader; digest: string; tag: string }[] = [];
      try {
        const partsLabel = own.config.config?.Labels?.[PARTS_LABEL];
        const listed =
          partsLabel !== undefined && `sha256:${createHash("sha256").update(partsLabel).digest("hex")}` === digest;
        const parts: PartsList = listed
          ? (JSON.parse(partsLabel) as PartsList)
          : { own: { digest, size: 0 }, layers: [] };
        readers.push({ reader: own, digest: parts.own.digest, tag: snapshotId });
        for (const layer of parts.layers) {
          if (!LAYER_NAME.test(layer.name)) throw this.notWarren(snapshotId);
          if (have(layer.name)) continue;
          const tag = `${LAYER_TAG_PREFIX}${layer.name}`;
          readers.push({ reader: await this.oci.openLayer(tag, join(scratch, layer.name)), digest: layer.digest, tag });
        }
        let failed: AgentError | undefined;
        const check = async (part: (typeof readers)[number]) => {
          if ((await part.reader.finish()).digest !== part.digest) {
            failed = mismatch(part.tag, part.digest);
            throw failed;
          }
        };
        let result: T;
        try {
          result = await consume(
            (async function* () {
              for (const part of readers) {
                yield* part.reader.pieces();
                await check(part);
              }
            })(),
          );
        } catch (error) {
          // The importer wraps what failed its stream: the store's answer is the mismatch.
          throw failed ?? error;
        }
        try {
          for (const part of readers) await check(part);
        } catch (error) {
          await undo(result);
          throw error;
        }
        const downloadedBytes = readers.reduce((sum, part) => sum + part.reader.fetchedBytes, 0);
        this.log.info("snapshot pulled", {
          snapshotId,
          store: this.oci.description,
          parts: readers.length,
          downloadedBytes,
          ms: Math.round(performance.now() - started),
        });
        return { result, downloadedBytes };
      } finally {
        await own.close();
        for (const part of readers) if (part.reader !== own) await part.reader.close();
      }
    });
  }

  private notWarren(tag: string): AgentError {
    return new AgentError("failed_precondition", `'${tag}' in the store is not a part of a Warren snapshot`);
  }
}
