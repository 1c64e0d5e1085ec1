import { randomUUID } from "node:crypto";
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { CheckpointResult, ResumeResult } from "../driver.js";
import { processStartTime } from "../sandbox-process.js";
import type { CgroupManager } from "./cgroups.js";
import {
  type CriuExternalFiles,
  criuDeadlineMs,
  criuDump,
  criuExternalFiles,
  criuRestore,
  directorySize,
} from "./criu.js";
import { probeCriu } from "./criu-probe.js";
import { BOOT_ID, type InstanceContainers, RESOLV_CONF, WORKLOAD_FD, WORKLOAD_OOM_FD } from "./instance-container.js";
import type { InstanceRecord, InstanceRecords } from "./instance-records.js";
import type { NetworkPool } from "./network.js";
import { moveRestoredIntoWorkload } from "./restored-workload.js";
import { freezeSeizable } from "./seizable-freeze.js";

export interface PauseTiersOptions {
  readonly records: InstanceRecords;
  readonly containers: InstanceContainers;
  readonly cgroups: CgroupManager;
  readonly network: NetworkPool;
  /** CRIU 4 (NamespaceDriverOptions.criu); without it there is no checkpoint tier. */
  readonly criu: string | undefined;
  readonly uidBase: number;
  readonly log: Logger;
}

/**
 * The pause tiers of a namespace instance: `pause` freezes its cgroup (memory stays resident); `checkpoint` dumps
 * the frozen tree with CRIU (criu.ts) to `<instance>/checkpoint` (processes end, memory released); `resume` thaws
 * it, or restores that checkpoint (same pids, same address). `stop` ends every process keeping the writable layer,
 * network and cgroups; `reboot` starts the container afresh over them. Every step persists the record it changed.
 */
export class PauseTiers {
  /** The configured CRIU, once the start-up probe has seen it dump and restore a process. */
  private criuUsable = false;

  constructor(private readonly options: PauseTiersOptions) {}

  /** Probes the configured CRIU (at agent start): the checkpoint tier exists only where it works. */
  async probe(): Promise<void> {
    if (!this.options.criu) return;
    const probe = await probeCriu(this.options.criu);
    this.criuUsable = probe.usable;
    if (probe.usable) this.options.log.info("CRIU checkpoint tier available", { reason: probe.reason });
    else
      this.options.log.warn("CRIU does not work on this host: paused sandboxes stay frozen in memory", {
        reason: probe.reason,
      });
  }

  get canCheckpoint(): boolean {
    return this.options.criu !== undefined && this.criuUsable;
  }

  async pause(record: InstanceRecord): Promise<void> {
    await this.options.cgroups.open(record.instanceId).freeze();
    record.paused = true;
    await this.options.records.persist(record);
  }

  /** CRIU dump of a frozen sandbox (criu.ts): its processes end, their memory is released. */
  async checkpoint(record: InstanceRecord): Promise<CheckpointResult> {
    const { instanceId } = record;
    const criu = this.options.criu;
    if (!criu || !this.criuUsable) throw new Error("no working CRIU on this node");
    // A volume is a bind of a shared folder CRIU would have to dump as an external mount: such a sandbox stays in
    // the freezer tier (its files are in the volume, not in its memory).
    if (record.volumes?.length) throw new Error(`instance '${instanceId}' mounts volumes: it stays frozen`);
    if (!record.paused || record.checkpoint || record.pid === undefined) {
      throw new Error(`instance '${instanceId}' is not frozen`);
    }
    const dir = this.options.records.dir(instanceId);
    const images = join(dir, "checkpoint");
    const cgroup = this.options.cgroups.open(instanceId);
    // Frozen since the pause, perhaps at a moment CRIU cannot seize (seizable-freeze.ts).
    await freezeSeizable(cgroup);
    const memoryBeforeBytes = (await cgroup.usage()).memoryBytes;
    const files = await criuExternalFiles(record.pid, join(dir, "envd.log"), {
      procsFile: cgroup.workloadProcsFile,
      fd: WORKLOAD_FD,
      oomFile: cgroup.workloadOomControlFile,
      oomFd: WORKLOAD_OOM_FD,
    });
    try {
      await criuDump({
        criu,
        netnsPath: this.options.network.slot(record.slot).netnsPath,
        pid: record.pid,
        imagesDir: images,
        freezerDir: cgroup.freezerDir,
        ...files,
        instanceFiles: [RESOLV_CONF, BOOT_ID],
        deadlineMs: criuDeadlineMs(memoryBeforeBytes),
      });
    } catch (error) {
      // A failed dump leaves the tree running or frozen: make it frozen again, as the caller expects.
      await cgroup.freeze().catch(() => undefined);
      throw error;
    }
    record.checkpoint = files;
    await this.options.records.persist(record);
    return {
      imageBytes: await directorySize(images),
      memoryBeforeBytes,
      memoryAfterBytes: (await cgroup.usage()).memoryBytes,
    };
  }

  /**
   * Filesystem-only pause: ends every process (their memory is released at once) and drops a checkpoint if there
   * is one; the writable layer, network and cgroups stay for `reboot`.
   */
  async stop(record: InstanceRecord): Promise<void> {
    const { instanceId } = record;
    await this.options.cgroups.open(instanceId).killAll();
    await this.options.containers.remove(instanceId);
    await rm(join(this.options.records.dir(instanceId), "checkpoint"), { recursive: true, force: true });
    record.checkpoint = undefined;
    record.stopped = true;
    record.paused = true;
    await this.options.records.persist(record);
  }

  /** Starts a paused instance afresh over its kept filesystem: processes are lost, the boot id is new. */
  async reboot(record: InstanceRecord): Promise<void> {
    const { instanceId } = record;
    // Also after a failed reboot: whatever it left (processes, crun state) goes first.
    await this.stop(record);
    const dir = this.options.records.dir(instanceId);
    await writeFile(join(dir, "boot_id"), `${randomUUID()}\n`);
    const cgroup = this.options.cgroups.open(instanceId);
    await this.options.containers.relaunch(record, cgroup);
    await this.options.containers.waitReady(record, cgroup, this.options.log.child({ instanceId }));
    record.stopped = false;
    record.paused = false;
    await this.options.records.persist(record);
  }

  async resume(record: InstanceRecord): Promise<ResumeResult> {
    const { instanceId } = record;
    if (record.stopped) throw new Error(`instance '${instanceId}' was stopped (filesystem-only pause): reboot it`);
    if (record.checkpoint) {
      await this.restore(record);
      record.paused = false;
      await this.options.records.persist(record);
      return { tier: "checkpoint" };
    }
    await this.options.cgroups.open(instanceId).thaw();
    record.paused = false;
    await this.options.records.persist(record);
    return { tier: "freezer" };
  }

  /** Restores the instance's own checkpoint (same pids, same address). On failure the images stay: still paused. */
  private async restore(record: InstanceRecord): Promise<void> {
    if (!record.checkpoint) throw new Error("no checkpoint to restore");
    const images = join(this.options.records.dir(record.instanceId), "checkpoint");
    await this.restoreFrom(record, images, record.checkpoint);
    record.checkpoint = undefined;
    await this.options.records.persist(record);
    await rm(images, { recursive: true, force: true });
  }

  /**
   * CRIU restore of `images` into this instance (criu.ts): its cgroups, network and mounted root; its own
   * resolv.conf and boot id. Ready when envd (and the gateway) answer; a tree that does not is ended again.
   */
  async restoreFrom(record: InstanceRecord, images: string, files: CriuExternalFiles): Promise<void> {
    const criu = this.options.criu;
    if (!criu || !this.criuUsable) throw new Error("no working CRIU on this node");
    const dir = this.options.records.dir(record.instanceId);
    const cgroup = this.options.cgroups.open(record.instanceId);
    const pid = await criuRestore({
      criu,
      netnsPath: this.options.network.slot(record.slot).netnsPath,
      procsFiles: cgroup.procsFiles,
      imagesDir: images,
      workDir: join(dir, "criu"),
      rootfs: join(dir, "rootfs"),
      logPath: join(dir, "envd.log"),
      logFileKey: files.logFileKey,
      ...(files.workloadFileKey
        ? {
            workload: {
              fileKey: files.workloadFileKey,
              procsFile: cgroup.workloadProcsFile,
              ...(files.workloadOomFileKey
                ? { oom: { fileKey: files.workloadOomFileKey, file: cgroup.workloadOomControlFile } }
                : {}),
            },
          }
        : {}),
      uid: this.options.uidBase,
      instanceFiles: { [RESOLV_CONF]: join(dir, "resolv.conf"), [BOOT_ID]: join(dir, "boot_id") },
      deadlineMs: criuDeadlineMs(await directorySize(images)),
    });
    record.pid = pid;
    record.pidStartTime = await processStartTime(pid);
    await moveRestoredIntoWorkload(cgroup, this.options.log);
    try {
      await this.options.containers.waitReady(
        record,
        cgroup,
        this.options.log.child({ instanceId: record.instanceId }),
      );
    } catch (error) {
      await this.options.cgroups.open(record.instanceId).killAll();
      await this.options.records.persist(record);
      throw error;
    }
    await this.options.records.persist(record);
  }
}
