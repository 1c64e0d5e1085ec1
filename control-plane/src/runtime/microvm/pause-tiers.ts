import { rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { CheckpointResult, ResumeResult } from "../driver.js";
import type { InstanceRecord, InstanceRecords } from "./instance-records.js";
import type { InstanceVms } from "./instance-vm.js";
import { killVm, processStartTime, processUsage, stopGuest, waitGone } from "./qemu.js";
import { snapshotAndQuit } from "./qemu-migration.js";
import { SNAPSHOT_TIMEOUT_MS } from "./template-snapshots.js";

/**
 * The pause tiers of a microVM instance: `pause` = QMP `stop` (instant; memory stays resident in QEMU);
 * `checkpoint` = migrate the stopped VM's memory to `<instance>/memory.snap` and quit QEMU (memory released);
 * `resume` = `cont`, or restore that file into a new QEMU over the same disk and tap (same guest processes and
 * pids; the guest's TCP stack survives). `stop` quits QEMU keeping the disk; `reboot` cold-boots over it. Every
 * step persists the record it changed.
 */
export class PauseTiers {
  constructor(
    private readonly records: InstanceRecords,
    private readonly vms: InstanceVms,
    private readonly log: Logger,
  ) {}

  async pause(record: InstanceRecord): Promise<void> {
    await this.vms.qmp(record, "stop");
    record.paused = true;
    await this.records.persist(record);
  }

  async checkpoint(record: InstanceRecord): Promise<CheckpointResult> {
    const { instanceId } = record;
    if (!record.paused || record.checkpointed || record.stopped || record.pid === undefined) {
      throw new Error(`instance '${instanceId}' is not paused in memory`);
    }
    const memoryBeforeBytes = (await processUsage(record.pid)).rssBytes;
    const path = join(this.records.dir(instanceId), "memory.snap");
    const tmp = `${path}.tmp`;
    if (record.pausedImage) {
      // The memory is saved already (a snapshot while paused); QEMU, in `postmigrate`, could not save it again.
      await rename(join(this.records.dir(instanceId), "memory.paused"), tmp);
      await killVm(record.pid, record.pidStartTime);
    } else {
      try {
        await snapshotAndQuit(this.vms.qmpPath(record), tmp, SNAPSHOT_TIMEOUT_MS);
      } catch (error) {
        await rm(tmp, { force: true });
        // QEMU is still there with stopped vCPUs (a failed migration leaves the source as it was): still paused.
        throw error;
      }
      await waitGone(record.pid, record.pidStartTime ?? "", 10_000);
      await killVm(record.pid, record.pidStartTime);
    }
    // No QEMU until the resume, which starts it in a new cgroup.
    await this.vms.release(record);
    await rename(tmp, path);
    record.pausedImage = false;
    record.checkpointed = true;
    record.pid = undefined;
    record.pidStartTime = undefined;
    await this.records.persist(record);
    return { imageBytes: (await stat(path)).size, memoryBeforeBytes, memoryAfterBytes: 0 };
  }

  async resume(record: InstanceRecord): Promise<ResumeResult> {
    const { instanceId } = record;
    if (record.stopped) throw new Error(`instance '${instanceId}' was stopped (filesystem-only pause): reboot it`);
    if (record.checkpointed) {
      const path = join(this.records.dir(instanceId), "memory.snap");
      // On failure the checkpoint stays: the sandbox is still paused and the resume can be retried.
      await this.vms.restore(record, path);
      record.checkpointed = false;
      record.paused = false;
      await this.records.persist(record);
      await rm(path, { force: true });
      return { tier: "checkpoint" };
    }
    await this.vms.qmp(record, "cont");
    await this.vms.syncClock(record);
    record.paused = false;
    await this.forgetPausedImage(record);
    return { tier: "freezer" };
  }

  /**
   * Filesystem-only pause: QEMU ends, the disk stays. The guest first ends its processes and flushes its page
   * cache (vCPUs run for that moment if the VM was paused): files written just before the pause are on the disk
   * a reboot mounts, and clients see their connections closed rather than silently dead.
   */
  async stop(record: InstanceRecord): Promise<void> {
    const { instanceId } = record;
    if (record.pid !== undefined && (await processStartTime(record.pid)) === record.pidStartTime) {
      const synced = await this.vms
        .qmp(record, "cont")
        .then(() => stopGuest(this.vms.consolePath(record), 10_000))
        .catch(() => false);
      if (!synced) this.log.warn("the guest did not confirm its shutdown before stop", { instanceId });
      // QEMU exits by itself once PID 1 has gone (see guest-image.ts); SIGKILL below only if it has not.
      else await waitGone(record.pid, record.pidStartTime ?? "", 5_000);
    }
    await killVm(record.pid, record.pidStartTime);
    await this.vms.release(record);
    await rm(join(this.records.dir(instanceId), "memory.snap"), { force: true });
    record.pid = undefined;
    record.pidStartTime = undefined;
    record.checkpointed = false;
    record.stopped = true;
    record.paused = true;
    await this.forgetPausedImage(record);
  }

  /** `stop`, then a cold boot over the kept disk (new boot id; processes lost). */
  async reboot(record: InstanceRecord): Promise<void> {
    await this.stop(record);
    await this.vms.boot(record, this.log.child({ instanceId: record.instanceId }));
    record.stopped = false;
    record.paused = false;
    await this.records.persist(record);
  }

  /** The guest ran on (or ended): `memory.paused` no longer holds its memory. Persists the record. */
  async forgetPausedImage(record: InstanceRecord): Promise<void> {
    record.pausedImage = false;
    await this.records.persist(record);
    await rm(join(this.records.dir(record.instanceId), "memory.paused"), { force: true });
  }
}
