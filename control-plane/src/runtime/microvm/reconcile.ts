import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { Instance, ReconcileResult } from "../driver.js";
import { healthy } from "../sandbox-process.js";
import type { VmEgress } from "./egress.js";
import { type InstanceRecord, type InstanceRecords, toInstance } from "./instance-records.js";
import type { InstanceVms } from "./instance-vm.js";
import type { VmNetwork } from "./network.js";
import { processStartTime } from "./qemu.js";
import type { SandboxSnapshots } from "./snapshots.js";
import type { VmCgroups } from "./vm-cgroups.js";

/** What reconcile works on: the driver's live instances (filled here) and the parts that own host resources. */
export interface VmReconcileScope {
  readonly instances: Map<string, InstanceRecord>;
  readonly records: InstanceRecords;
  readonly vms: InstanceVms;
  readonly network: VmNetwork;
  readonly cgroups: VmCgroups;
  readonly egress: VmEgress;
  readonly snapshots: SandboxSnapshots;
  /** Removes everything a dead instance has (the driver's teardown, which also forgets it). */
  readonly teardown: (record: InstanceRecord) => Promise<void>;
  readonly log: Logger;
}

/**
 * After an agent restart: re-adopts every microVM whose record and network namespace are there and whose QEMU
 * still runs (paused, or with envd answering), or that was checkpointed or stopped; removes the others, then
 * network slots, cgroups and deleted snapshots no adopted instance owns.
 */
export async function reconcileInstances(scope: VmReconcileScope): Promise<ReconcileResult> {
  const { instances, records, vms, network, cgroups, egress, snapshots, log } = scope;
  const adopted: Instance[] = [];
  const removed: { instanceId: string; labels: Record<string, string> }[] = [];
  const withQemu = new Set<string>();
  for (const name of await records.names()) {
    const record = await records.load(name);
    if (!record) {
      await vms.killStray(name);
      await rm(records.dir(name), { recursive: true, force: true });
      continue;
    }
    const netns = existsSync(network.slot(record.slot).netnsPath);
    const alive = record.pid !== undefined && (await processStartTime(record.pid)) === record.pidStartTime;
    if (alive && !record.paused) await vms.continueInterruptedSnapshot(record);
    const running = alive && (record.paused || (await healthy(record.addr, 2000)));
    const checkpointed = record.checkpointed === true && existsSync(join(records.dir(name), "memory.snap"));
    const stopped = record.stopped === true;
    if (netns && (running || checkpointed || stopped)) {
      instances.set(name, record);
      network.reserve(record.slot);
      if (running && record.pid !== undefined) {
        withQemu.add(name);
        await cgroups
          .adopt(name, record.resources, record.pid)
          .catch((error) => log.error("adopting a microVM's cgroup failed", { instanceId: name, error }));
      }
      // The gateway listens on new ports after a restart: rewrite the namespace's rules to match.
      await egress
        .apply(network.slot(record.slot), record.egress)
        .catch((error) =>
          log.error("restoring an adopted sandbox's egress policy failed", { instanceId: name, error }),
        );
      adopted.push(toInstance(record));
    } else {
      log.warn("removing dead microVM instance found at start", { instanceId: name });
      await scope.teardown(record);
      removed.push({ instanceId: name, labels: record.labels });
    }
  }
  await network.sweep(new Set([...instances.values()].map((r) => r.slot)));
  // Cgroups of dead instances, of checkpointed or stopped ones (no QEMU), of directories without a record.
  for (const instanceId of await cgroups.sweep(withQemu)) {
    log.warn("removed a microVM cgroup without a running QEMU", { instanceId });
  }
  // Deleted snapshots whose last user was removed above (or killed while the agent was down).
  await snapshots.sweep({ tmp: true });
  return { adopted, removed };
}
