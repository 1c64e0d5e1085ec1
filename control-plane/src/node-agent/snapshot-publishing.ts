import { join } from "node:path";
import type { SnapshotImage } from "../runtime/driver.js";
import type { NodeAgentConfig } from "./config.js";
import type { Logger } from "./log.js";
import type { NodeSnapshots } from "./node-snapshots.js";
import { PackCache } from "./pack-cache.js";
import { type PublishedSnapshot, SnapshotStore } from "./snapshot-store.js";

/**
 * This node's side of the cluster's snapshot store: its snapshots published (the driver's export stream without
 * its shared layers, and each layer the store lacks), and published ones pulled in (digests checked, only the
 * layers this node lacks) unless this node has them already. The store itself, skopeo and the OCI layout, is
 * snapshot-store.ts; the snapshots on this node are NodeSnapshots'.
 */
export class SnapshotPublishing {
  private readonly store: SnapshotStore;

  constructor(
    config: Pick<NodeAgentConfig, "store" | "stateDir" | "packCacheMB">,
    private readonly snapshots: Pick<NodeSnapshots, "export" | "import" | "delete" | "list" | "layers">,
    log: Logger,
  ) {
    // Tests build configs by hand; an absent store is the loader's default.
    this.store = new SnapshotStore(
      config.store ?? { url: "oci:/var/lib/warren/store", insecure: false },
      join(config.stateDir, "store-work"),
      log,
      new PackCache(join(config.stateDir, "pack-cache"), (config.packCacheMB ?? 2048) * 2 ** 20),
    );
  }

  /** Publishes a snapshot of this node to the cluster's store (a built template); resolves with its digest. */
  async publish(snapshotId: string, labels: Readonly<Record<string, string>>): Promise<PublishedSnapshot> {
    const shared = this.snapshots.layers;
    const layers = (await shared?.layersOf(snapshotId)) ?? [];
    const omit = new Set(layers);
    // Checked here (an unknown snapshot fails before the store is touched); the store may read the part twice (a
    // pack base it drops), so each read is a new export.
    const first = await this.snapshots.export(snapshotId, omit);
    let unread: AsyncIterable<Uint8Array> | undefined = first;
    const snapshots = this.snapshots;
    return this.store.publish(
      snapshotId,
      {
        own: () => {
          const stream = unread;
          unread = undefined;
          return (
            stream ??
            (async function* () {
              yield* await snapshots.export(snapshotId, omit);
            })()
          );
        },
        layers,
        layer: (name) => {
          if (!shared) throw new Error("this driver has no shared layers");
          return shared.exportLayer(name);
        },
      },
      labels,
    );
  }

  /** The snapshot ids published to the cluster's store. */
  listPublished(): Promise<string[]> {
    return this.store.listPublished();
  }

  /** Removes a published snapshot from the cluster's store; idempotent. */
  unpublish(snapshotId: string): Promise<void> {
    return this.store.unpublish(snapshotId);
  }

  /** Removes the store's layers no published snapshot stacks (see SnapshotStore.collectLayers). */
  collectLayers(graceMs: number): Promise<string[]> {
    return this.store.collectLayers(graceMs);
  }

  /**
   * Pulls a published snapshot from the store (digests checked) unless this node has it already: its own part and
   * the layers this node lacks.
   */
  async pull(snapshotId: string, digest: string): Promise<{ snapshot: SnapshotImage; downloadedBytes: number }> {
    const have = (await this.snapshots.list()).find((s) => s.snapshotId === snapshotId);
    if (have) return { snapshot: have, downloadedBytes: 0 };
    const local = new Set((await this.snapshots.layers?.localLayers()) ?? []);
    const { result, downloadedBytes } = await this.store.pull(
      snapshotId,
      digest,
      (layer) => local.has(layer),
      (data) => this.snapshots.import(snapshotId, data),
      // Imported from a part that failed its digest once read through: it never counts.
      (snapshot) => this.snapshots.delete(snapshot.snapshotId),
    );
    return { snapshot: result, downloadedBytes };
  }
}
