import { isSnapshotId } from "@warren/proto/redis";
import type { RuntimeDriver, SnapshotImage, SnapshotLayers } from "../runtime/driver.js";
import { AgentError } from "./errors.js";
import { type Logger, tenths } from "./log.js";
import type { SandboxSummary } from "./sandbox-model.js";
import type { SandboxQueue } from "./sandbox-queue.js";

/**
 * The node's snapshots: captures of its sandboxes (in the sandbox's operation queue), creates' lookups, deletes,
 * and the byte streams that move them between nodes — checked here, kept by the driver.
 */
export class NodeSnapshots {
  constructor(
    private readonly driver: RuntimeDriver,
    private readonly queue: SandboxQueue,
    private readonly requireSandbox: (sandboxId: string) => SandboxSummary,
    private readonly log: Logger,
  ) {}

  async find(snapshotId: string, templateId: string): Promise<SnapshotImage> {
    const snapshot = (await this.driver.listSnapshots()).find((s) => s.snapshotId === snapshotId);
    if (!snapshot) throw new AgentError("not_found", `snapshot '${snapshotId}' is not on this node`);
    if (snapshot.templateId !== templateId) {
      throw new AgentError(
        "invalid_argument",
        `snapshot '${snapshotId}' is of template '${snapshot.templateId}', not '${templateId}'`,
      );
    }
    return snapshot;
  }

  /**
   * Captures a sandbox as a snapshot on this node (files; processes and memory where the driver keeps them). It
   * waits for any pause/resume/checkpoint of the sandbox, like those wait for each other; a running sandbox is
   * still for the copy only (its route stays `running`: requests wait, streams stay open).
   */
  async capture(sandboxId: string, snapshotId: string, filesOnly = false): Promise<SnapshotImage> {
    if (!isSnapshotId(snapshotId)) {
      throw new AgentError("invalid_argument", `invalid snapshot id '${snapshotId}' (a-z, 0-9, '_', '-'; at most 63)`);
    }
    return this.queue.run(sandboxId, async () => {
      const sandbox = this.requireSandbox(sandboxId);
      if ((await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId)) {
        throw new AgentError("already_exists", `snapshot '${snapshotId}' already exists on this node`);
      }
      const startedAt = performance.now();
      let image: SnapshotImage;
      try {
        image = await this.driver.snapshot(sandbox.instanceId, snapshotId, { filesOnly });
      } catch (error) {
        throw new AgentError("internal", `snapshot of sandbox '${sandboxId}' failed: ${(error as Error).message}`);
      }
      this.log.info("sandbox snapshotted", {
        sandboxId,
        snapshotId,
        memory: image.memory,
        sizeMiB: tenths(image.sizeBytes / 2 ** 20),
        ms: tenths(performance.now() - startedAt),
      });
      return image;
    });
  }

  async delete(snapshotId: string): Promise<void> {
    if (!isSnapshotId(snapshotId)) return;
    await this.driver.deleteSnapshot(snapshotId);
    this.log.info("snapshot deleted", { snapshotId });
  }

  list(): Promise<SnapshotImage[]> {
    return this.driver.listSnapshots();
  }

  /** The driver's shared snapshot layers, when it has them. */
  get layers(): SnapshotLayers | undefined {
    return this.driver.snapshotLayers;
  }

  /** The snapshot as a byte stream for another node (ImportSnapshot there), without the layers it has. */
  async export(snapshotId: string, omitLayers?: ReadonlySet<string>): Promise<AsyncIterable<Uint8Array>> {
    if (!this.driver.exportSnapshot) {
      throw new AgentError("unimplemented", `the ${this.driver.name} driver cannot move snapshots between nodes`);
    }
    if (!(await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId)) {
      throw new AgentError("not_found", `snapshot '${snapshotId}' is not on this node`);
    }
    return this.driver.exportSnapshot(snapshotId, omitLayers);
  }

  /** Stores a snapshot streamed from another node agent; on failure nothing of it is left. */
  async import(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    if (!isSnapshotId(snapshotId)) {
      throw new AgentError("invalid_argument", `invalid snapshot id '${snapshotId}' (a-z, 0-9, '_', '-'; at most 63)`);
    }
    if (!this.driver.importSnapshot) {
      throw new AgentError("unimplemented", `the ${this.driver.name} driver cannot move snapshots between nodes`);
    }
    if ((await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId)) {
      throw new AgentError("already_exists", `snapshot '${snapshotId}' already exists on this node`);
    }
    const startedAt = performance.now();
    let image: SnapshotImage;
    try {
      image = await this.driver.importSnapshot(snapshotId, data);
    } catch (error) {
      throw new AgentError("internal", `importing snapshot '${snapshotId}' failed: ${(error as Error).message}`);
    }
    this.log.info("snapshot imported", {
      snapshotId,
      sizeMiB: tenths(image.sizeBytes / 2 ** 20),
      ms: tenths(performance.now() - startedAt),
    });
    return image;
  }
}
