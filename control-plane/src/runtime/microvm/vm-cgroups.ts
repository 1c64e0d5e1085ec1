import { writeFile } from "node:fs/promises";
import type { SandboxResources } from "../driver.js";
import { type CgroupManager, detectCgroupManager, type SandboxCgroup } from "../namespace/cgroups.js";
import { type Accel, TCG_TB_SIZE_MIB } from "./qemu.js";

/**
 * Host memory QEMU may use beyond the guest's RAM, besides TCG's translation cache: its own (binary, heap, thread
 * stacks, device and migration buffers: 29–79 MiB resident here, QEMU's /proc/<pid>/smaps split by mapping, 512 MiB
 * guests under TCG through the lifecycle test: restores, commands, checkpoint, resume from disk, a cold boot) and
 * the page cache charged for its I/O (the memory file `cat` reads on a restore or writes on a checkpoint, the qcow2
 * layers), which is reclaimable: trimmed at the limit rather than killing the VM. 256 leaves about 175 MiB above
 * the largest for the page cache and what was not measured (KVM).
 */
export const QEMU_OVERHEAD_MIB = 256;

/**
 * Memory allowed beyond the guest's RAM for a QEMU under `accel`: QEMU_OVERHEAD_MIB, plus under TCG its
 * translation cache, which stays resident once filled (up to 452 MiB of it in the microvm test suites here).
 */
export function qemuOverheadMiB(accel: Accel): number {
  return QEMU_OVERHEAD_MIB + (accel === "tcg" ? TCG_TB_SIZE_MIB : 0);
}

/**
 * Tasks (processes + threads) a QEMU may have: main loop, RCU, one thread per vCPU, the block layer's worker pool
 * (up to 64), migration, and the `sh` + `cat` of an `exec:` migration. QEMU aborts when it cannot start a thread,
 * so the bound covers the pool's maximum rather than what an idle VM shows (about 10).
 */
export const QEMU_PIDS_MAX = 128;

/**
 * One cgroup per running QEMU, `<root>/warren/<instance>-vm/<instanceId>` (per controller on v1), with the
 * namespace driver's cgroup manager: memory = guest + qemuOverheadMiB (no swap), CPU quota = the sandbox's
 * cpuCount, pids = QEMU_PIDS_MAX. The launcher joins it before exec'ing QEMU, so the daemon and everything it
 * spawns are in it. It exists while QEMU runs: a checkpointed or stopped instance has none.
 */
export class VmCgroups {
  private readonly manager: CgroupManager;

  /** `instance` is an agent tag ([a-z0-9]{1,4}): `<instance>-vm` never names a namespace driver's parent. */
  constructor(
    instance: string,
    private readonly accel: Accel,
  ) {
    this.manager = detectCgroupManager(`warren/${instance}-vm`);
  }

  prepare(): Promise<void> {
    return this.manager.prepare();
  }

  /** The limits of an instance's QEMU cgroup. */
  limits(resources: SandboxResources): SandboxResources {
    return {
      ...resources,
      memoryMB: resources.memoryMB + qemuOverheadMiB(this.accel),
      pidsMax: QEMU_PIDS_MAX,
    };
  }

  /** A fresh cgroup for a QEMU about to start (whatever a previous one left is killed and removed first). */
  async create(instanceId: string, resources: SandboxResources): Promise<SandboxCgroup> {
    await this.discard(instanceId);
    return this.manager.create(instanceId, this.limits(resources));
  }

  /** The cgroup of a running QEMU, if it has one. */
  find(instanceId: string): SandboxCgroup | undefined {
    const cgroup = this.manager.open(instanceId);
    return cgroup.exists() ? cgroup : undefined;
  }

  /**
   * Re-adopts a running QEMU after an agent restart: its cgroup when it has one, else (a QEMU started before
   * cgroups) a new one it is moved into.
   */
  async adopt(instanceId: string, resources: SandboxResources, pid: number): Promise<void> {
    if (this.find(instanceId)) return;
    const cgroup = await this.manager.create(instanceId, this.limits(resources));
    for (const file of cgroup.procsFiles) await writeFile(file, String(pid));
  }

  /** Kills whatever is left in the instance's cgroup and removes it; nothing to do when it has none. */
  async discard(instanceId: string): Promise<void> {
    const cgroup = this.manager.open(instanceId);
    if (!cgroup.exists()) return;
    await cgroup.killAll();
    await cgroup.remove();
  }

  /** Removes the cgroups of this agent's tag whose instance is not in `keep` (orphans of a crash). */
  async sweep(keep: ReadonlySet<string>): Promise<string[]> {
    const orphans = (await this.manager.listNames()).filter((name) => !keep.has(name));
    for (const name of orphans) await this.discard(name);
    return orphans;
  }
}
