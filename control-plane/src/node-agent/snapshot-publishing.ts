import { join } from "node:path";
import type { SnapshotImage } from "../runtime/driver.js";
import type { NodeAgentConfig } from "./config.js";
import type { Logger } from "./log.js";
import type { NodeSnapshots } from "./node-snapshots.js";
import { type PublishedSnapshot, SnapshotStore } from "./snapshot-store.js";

/**
 * This node's side of the cluster's snapshot store: its snapshots published (the driver's export stream as one
 * OCI image), and published ones pulled in (digest checked) unless this node has them already. The store itself,
 * skopeo and the OCI layout, is snapshot-store.ts; the snapshots on this node are NodeSnapshots'.
 */
export class SnapshotPublishing {
  private readonly store: SnapshotStore;

  constructor(
    config: Pick<NodeAgentConfig, "store" | "stateDir">,
    private readonly snapshots: Pick<NodeSnapshots, "export" | "import" | "list">,
    log: Logger,
  ) {
    // Tests build configs by hand; an absent store is the loader's default.
    this.store = new SnapshotStore(
      config.store ?? { url: "oci:/var/lib/warren/store", insecure: false },
      join(config.stateDir, "store-work"),
      log,
    );
  }

  /** Publishes a snapshot of this node to the cluster's store (a built template); resolves with its digest. */
  async publish(snapshotId: string, labels: Readonly<Record<string, string>>): Promise<PublishedSnapshot> {
    const data = await this.snapshots.export(snapshotId);
    return this.store.publish(snapshotId, data, labels);
  }

  /** The snapshot ids published to the cluster's store. */
  listPublished(): Promise<string[]> {
    return this.store.listPublished();
  }

  /** Removes a published snapshot from the cluster's store; idempotent. */
  unpublish(snapshotId: string): Promise<void> {
    return this.store.unpublish(snapshotId);
  }

  /** Pulls a published snapshot from the store (digest checked) unless this node has it already. */
  async pull(snapshotId: string, digest: string): Promise<SnapshotImage> {
    const have = (await this.snapshots.list()).find((s) => s.snapshotId === snapshotId);
    if (have) return have;
    return this.store.pull(snapshotId, digest, (data) => this.snapshots.import(snapshotId, data));
  }
}
