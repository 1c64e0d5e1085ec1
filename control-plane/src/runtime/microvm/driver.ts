import { mkdir, readFile, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type {
  CheckpointResult,
  Instance,
  InstanceSpec,
  InstanceStats,
  ReconcileResult,
  ResumeResult,
  RuntimeDriver,
  SandboxResources,
  SnapshotImage,
  TemplateImage,
} from "../driver.js";
import { CLOSED_EGRESS, compileEgress, type EgressPolicy } from "../egress/policy.js";
import { DEFAULT_LOG_CAP, LogCap, type LogCapLimits } from "../log-cap.js";
import { bootLimits } from "./boot.js";
import { VmEgress } from "./egress.js";
import { createInstance } from "./instance-create.js";
import { type InstanceRecord, InstanceRecords, toInstance } from "./instance-records.js";
import { vmStats } from "./instance-stats.js";
import { InstanceVms } from "./instance-vm.js";
import { VmNetwork } from "./network.js";
import { PauseTiers } from "./pause-tiers.js";
import { type Accel, kernelCmdline, killVm } from "./qemu.js";
import { reconcileInstances } from "./reconcile.js";
import { qemuVersion, SnapshotTransfer } from "./snapshot-transfer.js";
import { captureInstance, captureState, publicImage, SandboxSnapshots, type VmIdentity } from "./snapshots.js";
import { SNAPSHOT_TIMEOUT_MS, type TemplateSnapshot, TemplateSnapshots } from "./template-snapshots.js";
import { VmCgroups } from "./vm-cgroups.js";

/**
 * The `microvm` runtime driver: one QEMU `microvm` machine per sandbox (Debian's cloud kernel by PVH, a small
 * initramfs, the template's root as an ext4 image under a per-sandbox qcow2 copy-on-write disk), envd inside the
 * guest, a tap device in a per-sandbox network namespace (network.ts).
 *
 * Creates restore a template snapshot, never cold-boot on the hot path: the first create of a template (its
 * ready check, at template build) boots a VM once (boot deadline, retried: TCG boots hang now and then,
 * RUNTIME-NOTES §3.4), waits for envd, and saves memory + disk state under `<dir>/snapshots/<key>`; every later
 * create restores it (`-incoming`, then `cont`) over a fresh qcow2 layer and gets its identity from envd's /init,
 * as in the namespace driver. All sandboxes share the snapshot's guest state from before /init (no token, no env).
 *
 * Pause tiers (pause-tiers.ts): QMP `stop`; memory to disk and QEMU ends; `cont` or a restore from that file;
 * filesystem-only `stop` and `reboot`. Egress (egress.ts): the namespace driver's policy model, enforced in the
 * sandbox's network namespace in front of the guest, with the node's egress gateway.
 *
 * Sandbox snapshots (snapshots.ts): memory + a copy of the instance's disk layer, taken in any state; instances
 * created from one restore it over a qcow2 layer on its disk, so its files outlive `deleteSnapshot` until its
 * last such instance is gone. They move to other nodes as self-contained streams (snapshot-transfer.ts).
 *
 * `accel: "tcg"` (software emulation) exists so CI machines without real KVM exercise this driver; it is chosen
 * only when asked for (probe.ts). Resource limits: memory and vCPUs are the VM's; the snapshot fixes them, so a
 * create asking for other memory or CPU than the template's defaults cold-boots (slow, but correct). On the host,
 * each QEMU runs in a cgroup of its own (vm-cgroups.ts: guest memory + QEMU's allowance, the sandbox's CPU quota,
 * a bound on QEMU's threads).
 */
export interface MicrovmDriverOptions {
  readonly stateDir: string;
  readonly instance: string;
  readonly netCidr: string;
  readonly accel: Accel;
  /** Shared cache of kernels, root images and template snapshots (default /var/lib/warren/microvm). */
  readonly imageDir: string;
  /** Unpacked Debian kernel package (scripts/setup-host.sh). */
  readonly linuxDir: string;
  readonly busybox?: string;
  readonly nodeBinary: string;
  readonly envdRoot: string;
  readonly uidBase: number;
  /** envd answering after a restore. */
  readonly readyTimeoutMs: number;
  /** One cold boot attempt (kernel + envd); TCG needs minutes on a loaded machine. */
  readonly bootTimeoutMs?: number;
  readonly bootAttempts?: number;
  /** Upstream DNS server (`ip` or `ip:port`) of the egress gateway; default: the node's resolv.conf. */
  readonly dnsUpstream?: string;
  /** See VmNetworkOptions.uplinkForwarding (default on). */
  readonly uplinkForwarding?: boolean;
  /** Template snapshots keep RAM in a file restored VMs map copy-on-write (qemu.ts `ramArgs`; default on). */
  readonly templateRamFile?: boolean;
  /** The cap on each guest's console.log (log-cap.ts; default DEFAULT_LOG_CAP). */
  readonly logCap?: LogCapLimits;
  readonly log: Logger;
}

export class MicrovmDriver implements RuntimeDriver {
  readonly name: string;
  readonly canCheckpoint = true;
  readonly snapshotsKeepMemory = true;
  readonly envdInitTimeoutMs: number;
  readonly network: VmNetwork;
  readonly snapshots: SandboxSnapshots;
  private readonly instances = new Map<string, InstanceRecord>();
  private readonly records: InstanceRecords;
  private readonly templates: TemplateSnapshots;
  private readonly vms: InstanceVms;
  private readonly tiers: PauseTiers;
  private readonly egress: VmEgress;
  private readonly cgroups: VmCgroups;
  private readonly transfer: SnapshotTransfer;
  /** Keeps each guest's console.log (its serial console, writable by the guest) under its cap. */
  private readonly logCap: LogCap;

  constructor(private readonly options: MicrovmDriverOptions) {
    this.name = options.accel === "kvm" ? "microvm" : "microvm-tcg";
    this.envdInitTimeoutMs = options.accel === "kvm" ? 10_000 : 60_000;
    this.network = new VmNetwork({
      instance: options.instance,
      cidr: options.netCidr,
      log: options.log,
      ...(options.uplinkForwarding === false ? { uplinkForwarding: false } : {}),
    });
    this.egress = new VmEgress(this.network, {
      netCidr: options.netCidr,
      log: options.log,
      ...(options.dnsUpstream ? { dnsUpstream: options.dnsUpstream } : {}),
    });
    this.records = new InstanceRecords(join(options.stateDir, "instances"));
    this.cgroups = new VmCgroups(options.instance, options.accel);
    this.snapshots = new SandboxSnapshots(options.stateDir, () => this.snapshotReferences(), options.log);
    const limits = bootLimits(options.accel, options.bootTimeoutMs, options.bootAttempts);
    this.templates = new TemplateSnapshots({
      images: {
        dir: options.imageDir,
        linuxDir: options.linuxDir,
        busybox: options.busybox ?? "/bin/busybox",
        nodeBinary: options.nodeBinary,
        envdRoot: options.envdRoot,
        uidBase: options.uidBase,
      },
      accel: options.accel,
      limits,
      network: this.network,
      ramFile: options.templateRamFile !== false,
      log: options.log,
    });
    this.vms = new InstanceVms({
      instance: options.instance,
      accel: options.accel,
      records: this.records,
      network: this.network,
      kernel: () => this.templates.guestKernel(),
      limits,
      readyTimeoutMs: options.readyTimeoutMs,
      cgroups: this.cgroups,
      log: options.log,
    });
    this.tiers = new PauseTiers(this.records, this.vms, options.log);
    this.transfer = new SnapshotTransfer({
      snapshots: this.snapshots,
      driver: this.name,
      identity: () => this.vmIdentity(),
      log: options.log,
    });
    this.logCap = new LogCap(
      () => [...this.instances.keys()].map((id) => join(this.instanceDir(id), "console.log")),
      options.logCap ?? DEFAULT_LOG_CAP,
      options.log.child({ part: "log-cap" }),
    );
  }

  instanceDir(instanceId: string): string {
    return this.records.dir(instanceId);
  }

  async start(): Promise<void> {
    await mkdir(this.records.root, { recursive: true });
    await this.cgroups.prepare();
    await this.egress.start();
    this.logCap.start();
  }

  /** The template's snapshot for these resources (template-snapshots.ts), built on first use. */
  ensureSnapshot(template: TemplateImage, resources: SandboxResources): Promise<TemplateSnapshot> {
    return this.templates.ensure(template, resources);
  }

  /** Restores a template or sandbox snapshot over a fresh disk layer, or cold-boots (instance-create.ts). */
  create(spec: InstanceSpec): Promise<Instance> {
    return createInstance(
      {
        driver: this.name,
        instances: this.instances,
        records: this.records,
        network: this.network,
        egress: this.egress,
        vms: this.vms,
        templates: this.templates,
        snapshots: this.snapshots,
        teardown: (record) => this.teardown(record),
        log: this.options.log,
      },
      spec,
    );
  }

  async label(instanceId: string, labels: Readonly<Record<string, string>>): Promise<Instance> {
    const record = this.require(instanceId);
    record.labels = { ...record.labels, ...labels };
    await this.persist(record);
    return this.toInstance(record);
  }

  async kill(instanceId: string): Promise<void> {
    await this.teardown(this.require(instanceId));
  }

  /**
   * Memory + disk of a running or paused instance, the disk of a stopped one (see snapshots.ts). A running
   * instance is stopped only for the memory save and disk copy (a few hundred ms) and continues with the same
   * processes; a paused one stays paused.
   */
  async snapshot(instanceId: string, snapshotId: string): Promise<SnapshotImage> {
    const record = this.require(instanceId);
    const state = captureState(record);
    // Before the guest stops: nothing is added between its `cont` and its clock being set.
    const vm = await this.vmIdentity();
    const meta = await this.snapshots.capture(snapshotId, async (dir) => {
      const memory = await captureInstance(
        {
          dir: this.instanceDir(instanceId),
          state,
          timeoutMs: SNAPSHOT_TIMEOUT_MS,
          onFrozen: async () => {
            record.pausedImage = true;
            await this.persist(record);
          },
        },
        dir,
      );
      return {
        driver: this.name,
        templateId: record.templateId,
        templateHash: record.templateHash,
        memory,
        resources: record.resources,
        vcpus: record.vcpus,
        sourceInstanceId: instanceId,
        ...(record.fromSnapshot ? { parent: record.fromSnapshot } : {}),
        ...(memory ? { vm } : {}),
      };
    });
    if (state === "running") await this.vms.syncClock(record);
    this.options.log.info("sandbox snapshot taken", {
      instanceId,
      snapshotId,
      state,
      memory: meta.memory,
      sizeBytes: meta.sizeBytes,
    });
    return publicImage(meta);
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.snapshots.delete(snapshotId);
  }

  /** The snapshot as a self-contained tar stream for another node (snapshot-transfer.ts). */
  exportSnapshot(snapshotId: string): AsyncIterable<Uint8Array> {
    return this.transfer.export(snapshotId);
  }

  /** Stores a stream another node's `exportSnapshot` made; refused unless this node can start it as it is. */
  async importSnapshot(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    return publicImage(await this.transfer.import(snapshotId, data));
  }

  /** What this node restores memory snapshots with (recorded in them, compared on import). */
  private async vmIdentity(): Promise<VmIdentity> {
    return {
      qemu: await qemuVersion(),
      accel: this.options.accel,
      kernel: (await this.templates.guestKernel()).version,
      cmdline: kernelCmdline(this.options.accel),
    };
  }

  listSnapshots(): Promise<SnapshotImage[]> {
    return this.snapshots.list();
  }

  /** Ids of the sandbox snapshots instance disks are layered on: live instances and every record on disk. */
  private async snapshotReferences(): Promise<Set<string>> {
    const refs = new Set<string>();
    for (const record of this.instances.values()) if (record.fromSnapshot) refs.add(record.fromSnapshot);
    for (const name of await this.records.names()) {
      const record = await this.records.load(name);
      if (record?.fromSnapshot) refs.add(record.fromSnapshot);
    }
    return refs;
  }

  async pause(instanceId: string): Promise<void> {
    await this.tiers.pause(this.require(instanceId));
  }

  checkpoint(instanceId: string): Promise<CheckpointResult> {
    return this.tiers.checkpoint(this.require(instanceId));
  }

  resume(instanceId: string): Promise<ResumeResult> {
    return this.tiers.resume(this.require(instanceId));
  }

  async stop(instanceId: string): Promise<void> {
    await this.tiers.stop(this.require(instanceId));
  }

  async reboot(instanceId: string): Promise<Instance> {
    const record = this.require(instanceId);
    await this.tiers.reboot(record);
    return this.toInstance(record);
  }

  /** The guest's serial console: kernel messages, the guest init's and envd's output. */
  async logTail(instanceId: string, maxBytes: number): Promise<string> {
    this.require(instanceId);
    const text = await readFile(join(this.instanceDir(instanceId), "console.log"), "utf8").catch(() => "");
    if (text.length <= maxBytes) return text;
    const tail = text.slice(-maxBytes);
    return tail.slice(tail.indexOf("\n") + 1);
  }

  list(): Instance[] {
    return [...this.instances.values()].map((r) => this.toInstance(r));
  }

  /** Host-side view of the VM (instance-stats.ts). */
  async stats(instanceId: string): Promise<InstanceStats> {
    const record = this.require(instanceId);
    return vmStats(record, this.instanceDir(instanceId), this.cgroups);
  }

  async reconcile(): Promise<ReconcileResult> {
    return reconcileInstances({
      instances: this.instances,
      records: this.records,
      vms: this.vms,
      network: this.network,
      cgroups: this.cgroups,
      egress: this.egress,
      snapshots: this.snapshots,
      teardown: (record) => this.teardown(record),
      log: this.options.log,
    });
  }

  async close(): Promise<void> {
    this.logCap.close();
    await this.egress.close();
    // Nothing of this agent is left on the node (a stop that killed every sandbox): neither are its chains.
    if (this.instances.size === 0) await this.network.removeChains();
  }

  /** Replaces the instance's egress policy: its namespace's firewall and the gateway's view, atomically each. */
  async setEgress(instanceId: string, policy: EgressPolicy): Promise<void> {
    const record = this.require(instanceId);
    const before = record.egress ?? CLOSED_EGRESS;
    if (compileEgress(before).key === compileEgress(policy).key) return;
    const slot = this.network.slot(record.slot);
    record.egress = policy;
    try {
      await this.egress.apply(slot, policy);
    } catch (error) {
      record.egress = before;
      await this.egress.apply(slot, before).catch(() => undefined);
      throw error;
    }
    await this.persist(record);
  }

  /** The egress policy an instance has (tests and `getInfo` checks). */
  egressOf(instanceId: string): EgressPolicy {
    return this.require(instanceId).egress ?? CLOSED_EGRESS;
  }

  /**
   * Removes everything an instance has, from any partial state: QEMU, its cgroup, network namespace, veth,
   * files; then a deleted snapshot it was the last user of.
   */
  private async teardown(record: InstanceRecord): Promise<void> {
    await killVm(record.pid, record.pidStartTime);
    await this.vms.killStray(record.instanceId);
    await this.vms.release(record);
    this.egress.forget(this.network.slot(record.slot));
    await this.network.release(this.network.slot(record.slot));
    this.instances.delete(record.instanceId);
    await rm(this.instanceDir(record.instanceId), { recursive: true, force: true });
    if (record.fromSnapshot) await this.snapshots.sweep();
  }

  private require(instanceId: string): InstanceRecord {
    const record = this.instances.get(instanceId);
    if (!record) throw new Error(`no instance '${instanceId}'`);
    return record;
  }

  private toInstance(record: InstanceRecord): Instance {
    return toInstance(record);
  }

  private persist(record: InstanceRecord): Promise<void> {
    return this.records.persist(record);
  }
}
