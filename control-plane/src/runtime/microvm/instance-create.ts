import { randomBytes } from "node:crypto";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { Instance, InstanceSpec, SandboxResources } from "../driver.js";
import { CLOSED_EGRESS } from "../egress/policy.js";
import { exec } from "../exec.js";
import type { VmEgress } from "./egress.js";
import { type InstanceRecord, type InstanceRecords, toInstance } from "./instance-records.js";
import type { InstanceVms } from "./instance-vm.js";
import type { VmNetwork, VmNetworkSlot } from "./network.js";
import { type SandboxSnapshots, startProblem } from "./snapshots.js";
import { type TemplateSnapshots, vcpusOf } from "./template-snapshots.js";

/** What a create works on: the driver's live instances (the new one is added here) and the parts it starts. */
export interface InstanceCreateScope {
  /** The driver's name (`microvm`, `microvm-tcg`): a sandbox snapshot starts only on its own driver. */
  readonly driver: string;
  readonly instances: Map<string, InstanceRecord>;
  readonly records: InstanceRecords;
  readonly network: VmNetwork;
  readonly egress: VmEgress;
  readonly vms: InstanceVms;
  readonly templates: TemplateSnapshots;
  readonly snapshots: SandboxSnapshots;
  /** Removes everything a registered instance has (the driver's teardown, which also forgets it). */
  readonly teardown: (record: InstanceRecord) => Promise<void>;
  readonly log: Logger;
}

/** The disk the instance's qcow2 layer is backed by, and the memory (and RAM file) it restores when it can. */
interface InstanceBase {
  readonly disk: string;
  readonly memory?: string;
  readonly ram?: string;
}

/**
 * Creates an instance: restores its template's snapshot (made on first use) or a sandbox snapshot over a fresh
 * qcow2 layer, or cold-boots when the memory or vCPUs differ from the snapshot's. The record is on disk before
 * anything else exists, so a crash at any later step is cleaned up by reconcile; a failure removes what was made.
 */
export async function createInstance(scope: InstanceCreateScope, spec: InstanceSpec): Promise<Instance> {
  if (spec.command) throw new Error("the microvm driver does not run custom start commands");
  if (spec.volumes?.length) {
    throw new Error("the microvm driver cannot mount volumes");
  }
  const { records, network } = scope;
  const instanceId = `v${randomBytes(6).toString("hex")}`;
  const log = scope.log.child({ instanceId, templateId: spec.template.templateId });
  const dir = records.dir(instanceId);
  let record: InstanceRecord | undefined;
  let slot: VmNetworkSlot | undefined;
  try {
    // Snapshots are made with the template's default resources (a BuiltTemplate carries its recipe).
    const defaults = (spec.template as { recipe?: { defaults?: SandboxResources } }).recipe?.defaults;
    const template = spec.snapshotId
      ? undefined
      : await scope.templates.ensure(spec.template, defaults ?? spec.resources);
    await mkdir(dir, { recursive: true });
    slot = await network.acquire();
    const draft = draftRecord(instanceId, spec, slot);
    const register = async () => {
      // On disk before anything else exists, so a crash at any later step is cleaned up by reconcile.
      await records.persist(draft);
      scope.instances.set(instanceId, draft);
      record = draft;
    };
    let base: InstanceBase;
    if (template) {
      draft.snapshotDir = template.dir;
      await register();
      const exact = template.memoryMB === spec.resources.memoryMB && template.vcpus === draft.vcpus;
      base = { disk: template.disk, ...(exact ? { memory: template.memory, ram: template.ram } : {}) };
    } else {
      base = await useSnapshot(scope, spec, draft, register);
    }
    await startOver(scope, draft, slot, base, log);
    return toInstance(draft);
  } catch (error) {
    log.warn("instance start failed; removing it", { error });
    if (record) await scope.teardown(record).catch((e) => log.error("cleanup failed", { error: e }));
    else {
      if (slot) await network.release(slot).catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
    }
    throw error;
  }
}

function draftRecord(instanceId: string, spec: InstanceSpec, slot: VmNetworkSlot): InstanceRecord {
  return {
    instanceId,
    templateId: spec.template.templateId,
    templateHash: spec.template.hash,
    slot: slot.index,
    addr: slot.sandboxAddr,
    resources: spec.resources,
    vcpus: vcpusOf(spec.resources),
    ...(spec.template.codeGateway ? { codeGateway: true } : {}),
    createdAt: Date.now(),
    labels: { ...spec.labels },
    egress: spec.egress ?? CLOSED_EGRESS,
    paused: false,
  };
}

/** The egress policy, the disk layer over `base`, then the guest: restored from its memory, or booted. */
async function startOver(
  scope: InstanceCreateScope,
  draft: InstanceRecord,
  slot: VmNetworkSlot,
  base: InstanceBase,
  log: Logger,
): Promise<void> {
  // Before the guest runs: a restored guest continues at once, with the network it had.
  await scope.egress.apply(slot, draft.egress);
  const disk = join(scope.records.dir(draft.instanceId), "disk.qcow2");
  await exec("qemu-img", ["create", "-q", "-f", "qcow2", "-b", base.disk, "-F", "qcow2", disk]);
  const started = performance.now();
  if (base.memory) {
    await scope.vms.restore(draft, base.memory, base.ram);
  } else {
    // Other memory or vCPUs than the snapshot's, or a files-only snapshot: a cold boot over the disk layer.
    await scope.vms.boot(draft, log);
    await scope.records.persist(draft);
  }
  log.debug("instance started", {
    fromMemory: base.memory !== undefined,
    ms: Math.round(performance.now() - started),
  });
}

/**
 * Checks that `spec` can start from its sandbox snapshot and registers the instance as a user of it, both under
 * the snapshots' lock: a concurrent deleteSnapshot then sees the instance and keeps the files it is layered on.
 */
function useSnapshot(
  scope: InstanceCreateScope,
  spec: InstanceSpec,
  draft: InstanceRecord,
  register: () => Promise<void>,
): Promise<InstanceBase> {
  const { snapshots } = scope;
  const snapshotId = spec.snapshotId ?? "";
  return snapshots.exclusive(async () => {
    const meta = await snapshots.read(snapshotId);
    if (!meta) throw new Error(`snapshot '${snapshotId}' does not exist on this node`);
    const problem = startProblem(meta, scope.driver, spec.template, spec.resources, draft.vcpus);
    if (problem) throw new Error(problem);
    // The disk layer's size is the snapshot's, whatever was asked for.
    draft.resources = { ...spec.resources, diskSizeMB: meta.resources.diskSizeMB };
    draft.fromSnapshot = snapshotId;
    await register();
    return {
      disk: snapshots.disk(snapshotId),
      ...(meta.memory ? { memory: snapshots.memory(snapshotId) } : {}),
    };
  });
}
