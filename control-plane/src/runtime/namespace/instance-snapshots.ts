import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { basename, join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { SandboxResources, SnapshotImage, SnapshotLayers, TemplateImage } from "../driver.js";
import { exec } from "../exec.js";
import type { CgroupManager } from "./cgroups.js";
import { criuDeadlineMs, criuDump, criuExternalFiles } from "./criu.js";
import { flattenLayers } from "./flatten.js";
import {
  BOOT_ID,
  type InstanceContainers,
  type LaunchCgroups,
  RESOLV_CONF,
  WORKLOAD_FD,
  WORKLOAD_OOM_FD,
} from "./instance-container.js";
import type { InstanceRecord, InstanceRecords } from "./instance-records.js";
import { type LayeredSnapshot, LayerStore, type MemoryImage } from "./layer-store.js";
import type { NetworkPool } from "./network.js";
import type { PauseTiers } from "./pause-tiers.js";
import { freezeSeizable } from "./seizable-freeze.js";

export interface InstanceSnapshotsOptions {
  readonly stateDir: string;
  /** The driver's live instances: the layers they stack are never collected. */
  readonly instances: ReadonlyMap<string, InstanceRecord>;
  readonly records: InstanceRecords;
  readonly containers: InstanceContainers;
  readonly tiers: PauseTiers;
  readonly cgroups: CgroupManager;
  readonly network: NetworkPool;
  /** CRIU 4 (NamespaceDriverOptions.criu): dumps the processes into memory snapshots. */
  readonly criu: string | undefined;
  readonly log: Logger;
}

/**
 * Sandbox snapshots of namespace instances, kept by the layer store (layer-store.ts): capturing an instance (its
 * writable layer, and its processes where CRIU works), starting an instance's processes from a memory snapshot,
 * and the store's list, delete, export and import as the driver offers them.
 */
export class InstanceSnapshots {
  private readonly store: LayerStore;

  constructor(private readonly options: InstanceSnapshotsOptions) {
    this.store = new LayerStore(options.stateDir, options.log.child({ part: "snapshots" }));
  }

  start(): Promise<void> {
    return this.store.start();
  }

  /** The snapshot, its layers held until `release` (an instance being created from it stacks them). */
  pin(snapshotId: string): Promise<{ snapshot: LayeredSnapshot; release: () => void }> {
    return this.store.pin(snapshotId);
  }

  /**
   * The writable layer is copied while the sandbox is frozen, then (where CRIU works and it has processes) its
   * processes are dumped from that same frozen moment, left in place: a running sandbox thaws right after (same
   * processes), a paused one stays paused, a checkpointed one lends its checkpoint.
   */
  async capture(record: InstanceRecord, snapshotId: string, filesOnly = false): Promise<SnapshotImage> {
    const { instanceId } = record;
    const cgroup = this.options.cgroups.open(instanceId);
    const freeze = !record.paused;
    const withMemory =
      !filesOnly &&
      this.options.tiers.canCheckpoint &&
      !record.stopped &&
      (record.checkpoint || record.pid !== undefined);
    // The files are copied and the processes dumped from one frozen moment, which CRIU must be able to seize.
    if (withMemory && !record.checkpoint) await freezeSeizable(cgroup);
    else if (freeze) await cgroup.freeze();
    const manifestDir = join(this.options.records.dir(instanceId), "captures");
    try {
      await mkdir(manifestDir, { recursive: true });
      const previous = record.captureLayers;
      const {
        layers,
        criu: _criu,
        ...image
      } = await this.store.capture(
        snapshotId,
        {
          templateId: record.templateId,
          templateHash: record.templateHash,
          resources: record.resources,
          upperDir: join(this.options.records.dir(instanceId), "disk", "upper"),
          layers: record.layers ?? [],
          incremental: { manifestDir, ...(previous ? { previous } : {}) },
        },
        withMemory ? (imagesDir) => this.dumpForSnapshot(record, imagesDir) : undefined,
      );
      // The new stack is the base of the next capture; the previous one's manifest is done with.
      record.captureLayers = [...layers];
      await this.options.records.persist(record);
      const replaced = previous?.[0];
      if (replaced) await rm(join(manifestDir, `${basename(replaced)}.manifest`), { force: true });
      return image;
    } finally {
      // Frozen again whatever CRIU did to the freezer (a paused sandbox stays paused), then thawed if it ran.
      if (withMemory && !record.checkpoint) await cgroup.freeze().catch(() => undefined);
      if (freeze) await cgroup.thaw();
    }
  }

  /** A files-only snapshot of a directory (copied into a layer) over `template`'s root. */
  async captureDirectory(
    snapshotId: string,
    template: TemplateImage,
    dir: string,
    resources: SandboxResources,
  ): Promise<SnapshotImage> {
    const { layers: _layers, ...image } = await this.store.capture(snapshotId, {
      templateId: template.templateId,
      templateHash: template.hash,
      resources,
      upperDir: dir,
      layers: [],
    });
    return image;
  }

  /** The snapshot's files as one root filesystem at `dest` (flatten.ts); it must be a snapshot over `template`. */
  async flatten(snapshotId: string, template: TemplateImage, dest: string): Promise<void> {
    const { snapshot, release } = await this.store.pin(snapshotId);
    try {
      if (snapshot.templateId !== template.templateId || snapshot.templateHash !== template.hash) {
        throw new Error(
          `snapshot '${snapshotId}' is over template ${snapshot.templateId} (${snapshot.templateHash}), not ${template.templateId} (${template.hash})`,
        );
      }
      await flattenLayers(snapshot.layers, template.rootfs, dest);
    } finally {
      release();
    }
  }

  private async dumpForSnapshot(record: InstanceRecord, imagesDir: string): Promise<MemoryImage> {
    const dir = this.options.records.dir(record.instanceId);
    const bootId = (await readFile(join(dir, "boot_id"), "utf8")).trim();
    if (record.checkpoint) {
      await exec("cp", ["-a", "--", join(dir, "checkpoint"), imagesDir]);
      return { ...record.checkpoint, bootId };
    }
    const criu = this.options.criu;
    if (!criu || record.pid === undefined) throw new Error(`instance '${record.instanceId}' has no processes to dump`);
    const cgroup = this.options.cgroups.open(record.instanceId);
    const files = await criuExternalFiles(record.pid, join(dir, "envd.log"), {
      procsFile: cgroup.workloadProcsFile,
      fd: WORKLOAD_FD,
      oomFile: cgroup.workloadOomControlFile,
      oomFd: WORKLOAD_OOM_FD,
    });
    await criuDump({
      criu,
      netnsPath: this.options.network.slot(record.slot).netnsPath,
      pid: record.pid,
      imagesDir,
      freezerDir: cgroup.freezerDir,
      ...files,
      leaveRunning: true,
      instanceFiles: [RESOLV_CONF, BOOT_ID],
      deadlineMs: criuDeadlineMs((await cgroup.usage()).memoryBytes),
    });
    return { ...files, bootId };
  }

  /** The snapshot's processes continue in `record`: same boot, this instance's root, network and cgroups. */
  async startFromMemory(
    record: InstanceRecord,
    cgroup: LaunchCgroups,
    snapshotId: string,
    memory: MemoryImage,
  ): Promise<void> {
    await writeFile(join(this.options.records.dir(record.instanceId), "boot_id"), `${memory.bootId}\n`);
    await this.options.containers.mountRoot(record, cgroup);
    await this.options.tiers.restoreFrom(record, this.store.memoryDir(snapshotId), memory);
  }

  async delete(snapshotId: string): Promise<void> {
    await this.store.delete(snapshotId);
    await this.collectLayers();
  }

  async list(): Promise<SnapshotImage[]> {
    return (await this.store.list()).map(({ layers: _layers, ...image }) => image);
  }

  export(snapshotId: string, omitLayers?: ReadonlySet<string>): AsyncIterable<Uint8Array> {
    return this.store.export(snapshotId, omitLayers);
  }

  /** The layer store's layers, as the driver offers them (`RuntimeDriver.snapshotLayers`). */
  readonly layers: SnapshotLayers = {
    layersOf: (snapshotId) => this.store.layerNames(snapshotId),
    localLayers: () => this.store.localLayers(),
    exportLayer: (name) => this.store.exportLayer(name),
  };

  async import(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    const { layers: _layers, ...image } = await this.store.import(snapshotId, data);
    return image;
  }

  /** Removes layers that neither a snapshot nor a live instance uses; never throws (logged). */
  async collectLayers(): Promise<void> {
    await this.store
      .collect(() =>
        [...this.options.instances.values()].flatMap((r) => [...(r.layers ?? []), ...(r.captureLayers ?? [])]),
      )
      .catch((error) => this.options.log.error("removing unused snapshot layers failed", { error }));
  }
}
