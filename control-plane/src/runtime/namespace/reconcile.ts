import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { Instance, ReconcileResult } from "../driver.js";
import { healthy, processStartTime } from "../sandbox-process.js";
import type { CgroupManager } from "./cgroups.js";
import type { InstanceContainers } from "./instance-container.js";
import { type InstanceRecord, type InstanceRecords, toInstance } from "./instance-records.js";
import type { InstanceSnapshots } from "./instance-snapshots.js";
import { mountPoints, unmountTree } from "./mounts.js";
import type { NetworkPool } from "./network.js";
import type { SandboxEgress } from "./sandbox-egress.js";

/** What reconcile works on: the driver's live instances (filled here) and the parts that own host resources. */
export interface ReconcileScope {
  readonly instances: Map<string, InstanceRecord>;
  readonly records: InstanceRecords;
  readonly containers: InstanceContainers;
  readonly cgroups: CgroupManager;
  readonly network: NetworkPool;
  readonly egress: SandboxEgress;
  readonly snapshots: InstanceSnapshots;
  /** Removes everything a dead instance has (the driver's teardown, which also forgets it). */
  readonly teardown: (record: InstanceRecord) => Promise<void>;
  readonly log: Logger;
}

/**
 * After an agent restart: re-adopts every instance whose record, processes (or checkpoint), root mount and
 * network namespace are all still there; removes the others, then anything of this agent's that no adopted
 * instance owns (cgroups, crun state, mounts, network slots, snapshot layers).
 */
export async function reconcileInstances(scope: ReconcileScope): Promise<ReconcileResult> {
  const { instances, records, network, log } = scope;
  const adopted: Instance[] = [];
  const removed: { instanceId: string; labels: Record<string, string> }[] = [];
  const names = await records.names();
  const mounts = new Set(await mountPoints());
  for (const name of names) {
    const record = await records.load(name);
    if (!record) {
      await unmountTree(records.dir(name));
      await rm(records.dir(name), { recursive: true, force: true });
      continue;
    }
    const alive =
      record.pid !== undefined &&
      (await processStartTime(record.pid)) === record.pidStartTime &&
      mounts.has(join(records.dir(name), "rootfs")) &&
      existsSync(network.slot(record.slot).netnsPath) &&
      (record.paused || (await healthy(record.addr, 1000)));
    // A checkpointed instance has no process: it is alive when its images, root and network are there.
    const stopped =
      record.stopped === true &&
      mounts.has(join(records.dir(name), "rootfs")) &&
      existsSync(network.slot(record.slot).netnsPath);
    const checkpointed =
      record.checkpoint !== undefined &&
      existsSync(join(records.dir(name), "checkpoint", "inventory.img")) &&
      mounts.has(join(records.dir(name), "rootfs")) &&
      existsSync(network.slot(record.slot).netnsPath);
    if (alive || checkpointed || stopped) {
      instances.set(name, record);
      // The gateway listens on new ports after a restart: rewrite the sandbox's rules to match.
      await scope.egress
        .apply(record)
        .catch((error) =>
          log.error("restoring an adopted sandbox's egress policy failed", { instanceId: name, error }),
        );
      adopted.push(toInstance(record));
    } else {
      log.warn("removing dead sandbox instance found at start", { instanceId: name });
      await scope.teardown(record);
      removed.push({ instanceId: name, labels: record.labels });
    }
  }
  await removeOrphans(scope);
  return { adopted, removed };
}

/** Orphans with no record at all: cgroups, crun state, mounts, network slots; then unused snapshot layers. */
async function removeOrphans(scope: ReconcileScope): Promise<void> {
  const { instances, records, cgroups, log } = scope;
  for (const name of await cgroups.listNames()) {
    if (instances.has(name)) continue;
    const cgroup = cgroups.open(name);
    await cgroup.killAll().catch(() => undefined);
    await cgroup.remove().catch((error) => log.error("orphan cgroup removal failed", { name, error }));
  }
  await scope.containers.removeUnknown((instanceId) => instances.has(instanceId));
  for (const point of await mountPoints()) {
    if (!point.startsWith(`${records.root}/`)) continue;
    const instanceId = point.slice(records.root.length + 1).split("/")[0] ?? "";
    if (!instances.has(instanceId)) await unmountTree(records.dir(instanceId));
  }
  await scope.network.sweep(new Set([...instances.values()].map((r) => r.slot)));
  await scope.snapshots.collectLayers();
}
