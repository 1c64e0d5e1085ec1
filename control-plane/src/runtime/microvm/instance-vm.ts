import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { type BootLimits, coldBoot, readyPorts, waitReady } from "./boot.js";
import type { GuestKernel } from "./guest-image.js";
import type { InstanceRecord, InstanceRecords } from "./instance-records.js";
import type { VmNetwork } from "./network.js";
import { type Accel, killVm, launchVm, processStartTime, syncGuestClock, type VmLaunch } from "./qemu.js";
import { finishRestore, queryStatus } from "./qemu-migration.js";
import { withQmp } from "./qmp.js";
import type { VmCgroups } from "./vm-cgroups.js";

export interface InstanceVmsOptions {
  /** Tag in QEMU's process name (`warren-<instance>-<id>`). */
  readonly instance: string;
  readonly accel: Accel;
  readonly records: InstanceRecords;
  readonly network: VmNetwork;
  readonly kernel: () => Promise<GuestKernel>;
  readonly limits: BootLimits;
  /** The guest answering after a restore. */
  readonly readyTimeoutMs: number;
  /** Every QEMU started here runs in its instance's cgroup. */
  readonly cgroups: VmCgroups;
  readonly log: Logger;
}

/**
 * The QEMU side of an instance: launching it (restore from a memory file, or cold boot) until the guest is ready,
 * its QMP and serial console, and QEMUs no record knows of. Updates `record.pid`/`pidStartTime`; the caller
 * keeps the rest of the record. Each launch gets a fresh cgroup (vm-cgroups.ts), removed again when the launch
 * fails; `release` removes it once QEMU has ended (checkpoint, stop).
 */
export class InstanceVms {
  constructor(private readonly options: InstanceVmsOptions) {}

  qmpPath(record: InstanceRecord): string {
    return join(this.options.records.dir(record.instanceId), "qmp.sock");
  }

  consolePath(record: InstanceRecord): string {
    return join(this.options.records.dir(record.instanceId), "console.sock");
  }

  /** Runs one QMP command (`stop`, `cont`). */
  async qmp(record: InstanceRecord, command: string): Promise<void> {
    await withQmp(this.qmpPath(record), (qmp) => qmp.execute(command));
  }

  private async launchOf(record: InstanceRecord, incoming?: string, ramFile?: string): Promise<VmLaunch> {
    const dir = this.options.records.dir(record.instanceId);
    const kernel = await this.options.kernel();
    const cgroup = await this.options.cgroups.create(record.instanceId, record.resources);
    const slot = this.options.network.slot(record.slot);
    return {
      name: `warren-${this.options.instance}-${record.instanceId}`,
      dir,
      netnsPath: slot.netnsPath,
      kernel,
      disk: join(dir, "disk.qcow2"),
      memoryMB: record.resources.memoryMB,
      vcpus: record.vcpus,
      accel: this.options.accel,
      ...(incoming ? { incoming } : {}),
      ...(ramFile ? { ram: { path: ramFile, shared: false } } : {}),
      cgroupProcs: cgroup.procsFiles,
      jail: { uid: slot.qemuUid, gid: slot.qemuUid },
    };
  }

  /**
   * Removes the instance's cgroup and anything left in it, once QEMU has ended (checkpoint, stop, kill, failed
   * launch). Never throws: a cgroup that could not go is logged, and the next launch's `create` or reconcile's
   * sweep removes it.
   */
  async release(record: InstanceRecord): Promise<void> {
    await this.options.cgroups
      .discard(record.instanceId)
      .catch((error) =>
        this.options.log.error("removing a microVM's cgroup failed", { instanceId: record.instanceId, error }),
      );
  }

  /**
   * New QEMU loading `memory` (a snapshot or the instance's checkpoint), resumed, clock set, guest ready. With
   * `ramFile` (a template snapshot's RAM, qemu.ts `ramArgs`), the guest's RAM is a private mapping of it and
   * `memory` holds the device state only.
   */
  async restore(record: InstanceRecord, memory: string, ramFile?: string): Promise<void> {
    const { readyTimeoutMs } = this.options;
    // One budget for the whole restore, launch to ready: each phase gets what is left, and a restore past it fails
    // even when its last phase succeeded at the first try.
    const deadline = Date.now() + readyTimeoutMs;
    const left = () => {
      const ms = deadline - Date.now();
      if (ms < 0) throw new Error(`the restored guest was not ready within ${readyTimeoutMs} ms`);
      return ms;
    };
    const phases: Record<string, number> = {};
    let mark = performance.now();
    const phase = (name: string) => {
      const now = performance.now();
      phases[name] = Math.round(now - mark);
      mark = now;
      left();
    };
    let pid: number;
    try {
      pid = await launchVm(await this.launchOf(record, memory, ramFile));
    } catch (error) {
      await this.release(record);
      throw error;
    }
    record.pid = pid;
    record.pidStartTime = await processStartTime(pid);
    await this.options.records.persist(record);
    try {
      phase("launchMs");
      await finishRestore(this.qmpPath(record), left(), ramFile !== undefined);
      phase("loadMs");
      // Every restore is a clone of a snapshot's memory, its kernel's random number generator included.
      await this.syncClock(record, true);
      phase("clockMs");
      await waitReady(record.addr, readyPorts(record.codeGateway), left(), pid, record.pidStartTime ?? "");
      phase("readyMs");
      this.options.log.debug("microVM restored", { instanceId: record.instanceId, ramFile: !!ramFile, ...phases });
    } catch (error) {
      await killVm(pid, record.pidStartTime);
      await this.release(record);
      throw error;
    }
  }

  /** A fresh boot over the instance's disk layer, until the guest is ready. */
  async boot(record: InstanceRecord, log: Logger): Promise<void> {
    try {
      const booted = await coldBoot(await this.launchOf(record), {
        addr: record.addr,
        ports: readyPorts(record.codeGateway),
        limits: this.options.limits,
        log,
      });
      record.pid = booted.pid;
      record.pidStartTime = booted.startTime;
    } catch (error) {
      await this.release(record);
      throw error;
    }
  }

  /** The guest's wall clock := the host's, before anyone uses the sandbox (see guest-image.ts for why). */
  async syncClock(record: InstanceRecord, reseed = false): Promise<void> {
    const timeoutMs = this.options.accel === "kvm" ? 2000 : 10_000;
    const done = await syncGuestClock(this.consolePath(record), timeoutMs, reseed ? randomBytes(32) : undefined);
    if (done === undefined) {
      this.options.log.warn("the guest did not confirm its clock", { instanceId: record.instanceId });
    } else if (reseed && done !== "reseeded") {
      this.options.log.warn("the guest could not force a reseed of its random number generator (no perl?)", {
        instanceId: record.instanceId,
        seed: done || "ignored",
      });
    }
  }

  /** An agent that died while snapshotting a running instance left its vCPUs stopped: they run on. */
  async continueInterruptedSnapshot(record: InstanceRecord): Promise<void> {
    await withQmp(this.qmpPath(record), async (qmp) => {
      const status = await queryStatus(qmp);
      if (status === "paused" || status === "postmigrate" || status === "finish-migrate") await qmp.execute("cont");
    }).catch(() => undefined);
  }

  /** A directory without a readable record may still have a QEMU (crash between launch and persist). */
  async killStray(instanceId: string): Promise<void> {
    const dir = this.options.records.dir(instanceId);
    const pidText = await readFile(join(dir, "qemu.pid"), "utf8").catch(() => "");
    const pid = Number(pidText.trim());
    if (!Number.isInteger(pid) || pid <= 0) return;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmdline.includes(dir)) await killVm(pid, await processStartTime(pid));
  }
}
