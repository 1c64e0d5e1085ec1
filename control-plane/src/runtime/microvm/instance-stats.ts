import { stat } from "node:fs/promises";
import { join } from "node:path";
import type { InstanceStats } from "../driver.js";
import type { InstanceRecord } from "./instance-records.js";
import { processUsage } from "./qemu.js";
import type { VmCgroups } from "./vm-cgroups.js";

/**
 * Host-side view: memory (the guest's RAM, QEMU's own, their page cache) and CPU time of QEMU's cgroup, against
 * the cgroup's memory limit (guest + QEMU's allowance, also when no QEMU runs); the disk layer's allocated
 * bytes. A QEMU without a cgroup (adoption failed) is measured by its process.
 */
export async function vmStats(record: InstanceRecord, dir: string, cgroups: VmCgroups): Promise<InstanceStats> {
  const cgroup = record.pid !== undefined ? cgroups.find(record.instanceId) : undefined;
  const usage = cgroup
    ? await cgroup.usage()
    : record.pid !== undefined
      ? await processUsage(record.pid).then((u) => ({ memoryBytes: u.rssBytes, cpuUsec: u.cpuUsec }))
      : { memoryBytes: 0, cpuUsec: 0 };
  const disk = await stat(join(dir, "disk.qcow2")).catch(() => undefined);
  return {
    memoryUsageBytes: usage.memoryBytes,
    // The sandbox's memory is its guest's (what E2B's memTotal means); the usage above is what the whole VM costs
    // the host (its cgroup: guest pages QEMU touched plus QEMU's own), which may exceed it under TCG.
    memoryLimitBytes: record.resources.memoryMB * 2 ** 20,
    cpuUsageUsec: usage.cpuUsec,
    pids: 0,
    pidsLimit: record.resources.pidsMax,
    diskUsageBytes: disk ? disk.blocks * 512 : 0,
    diskLimitBytes: record.resources.diskSizeMB * 2 ** 20,
  };
}
