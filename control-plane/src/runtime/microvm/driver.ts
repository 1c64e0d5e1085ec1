import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { request } from "node:http";
import { join } from "node:path";
import type { Logger } from "../../node-agent/log.js";
import { withFileLock } from "../../templates/lock.js";
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
import { exec } from "../exec.js";
import { ENVD_PORT, ensureKernel, ensureRootImage, type GuestImageOptions, type GuestKernel } from "./guest-image.js";
import { VmNetwork, type VmNetworkSlot } from "./network.js";
import {
  type Accel,
  finishRestore,
  kernelCmdline,
  killVm,
  launchVm,
  processStartTime,
  processUsage,
  queryStatus,
  snapshotAndQuit,
  stopGuest,
  syncGuestClock,
  type VmLaunch,
  waitGone,
} from "./qemu.js";
import { withQmp } from "./qmp.js";
import { captureInstance, captureState, SandboxSnapshots, startProblem } from "./snapshots.js";

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
 * Pause tiers: `pause` = QMP `stop` (instant; memory stays resident in QEMU); `checkpoint` = migrate the stopped
 * VM's memory to `<instance>/memory.snap` and quit QEMU (memory released); `resume` = `cont`, or restore that file
 * into a new QEMU over the same disk and tap (same guest processes and pids; the guest's TCP stack survives).
 * `stop` quits QEMU keeping the disk; `reboot` cold-boots over it.
 *
 * Sandbox snapshots (snapshots.ts): memory + a copy of the instance's disk layer, taken in any state; instances
 * created from one restore it over a qcow2 layer on its disk, so its files outlive `deleteSnapshot` until its
 * last such instance is gone.
 *
 * `accel: "tcg"` (software emulation) exists so CI machines without real KVM exercise this driver; it is chosen
 * only when asked for (probe.ts). Resource limits: memory and vCPUs are the VM's; the snapshot fixes them, so a
 * create asking for other memory or CPU than the template's defaults cold-boots (slow, but correct).
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
  readonly log: Logger;
}

interface InstanceRecord {
  instanceId: string;
  templateId: string;
  templateHash: string;
  /** Template snapshot this instance was restored from (its disk is the instance disk's backing file). */
  snapshotDir?: string;
  slot: number;
  addr: string;
  resources: SandboxResources;
  vcpus: number;
  createdAt: number;
  labels: Record<string, string>;
  pid?: number;
  pidStartTime?: string;
  paused: boolean;
  /** Memory saved to `<dir>/memory.snap`, no QEMU running. */
  checkpointed?: boolean;
  /** QEMU ended, disk kept (filesystem-only pause): the next start is a reboot. */
  stopped?: boolean;
  /**
   * Paused, and `<dir>/memory.paused` holds exactly its memory: a snapshot taken while paused left QEMU in
   * `postmigrate`, where QEMU 7.2 cannot migrate again; checkpoint and further snapshots use this file instead.
   */
  pausedImage?: boolean;
  /** The sandbox snapshot this instance was created from: its disk is the instance disk's backing file. */
  fromSnapshot?: string;
}

interface TemplateSnapshot {
  readonly dir: string;
  readonly disk: string;
  readonly memory: string;
  readonly memoryMiB: number;
  readonly vcpus: number;
}

const SNAPSHOT_TIMEOUT_MS = 120_000;

export class MicrovmDriver implements RuntimeDriver {
  readonly name: string;
  readonly canCheckpoint = true;
  readonly snapshotsKeepMemory = true;
  readonly network: VmNetwork;
  readonly snapshots: SandboxSnapshots;
  private readonly instances = new Map<string, InstanceRecord>();
  private readonly instancesDir: string;
  private readonly images: GuestImageOptions;
  private kernel: Promise<GuestKernel> | undefined;

  constructor(private readonly options: MicrovmDriverOptions) {
    this.name = options.accel === "kvm" ? "microvm" : "microvm-tcg";
    this.network = new VmNetwork(options.instance, options.netCidr);
    this.instancesDir = join(options.stateDir, "instances");
    this.snapshots = new SandboxSnapshots(options.stateDir, () => this.snapshotReferences(), options.log);
    this.images = {
      dir: options.imageDir,
      linuxDir: options.linuxDir,
      busybox: options.busybox ?? "/bin/busybox",
      nodeBinary: options.nodeBinary,
      envdRoot: options.envdRoot,
      uidBase: options.uidBase,
    };
  }

  instanceDir(instanceId: string): string {
    return join(this.instancesDir, instanceId);
  }

  private get bootTimeoutMs(): number {
    return this.options.bootTimeoutMs ?? (this.options.accel === "kvm" ? 30_000 : 120_000);
  }

  /** Kernel + initramfs until the guest init prints its marker (a healthy TCG boot here: 2–20 s). */
  private get initTimeoutMs(): number {
    return Math.min(this.bootTimeoutMs, this.options.accel === "kvm" ? 10_000 : 45_000);
  }

  async start(): Promise<void> {
    await mkdir(this.instancesDir, { recursive: true });
    await this.network.start();
  }

  private guestKernel(): Promise<GuestKernel> {
    if (!this.kernel) {
      this.kernel = ensureKernel(this.images);
      this.kernel.catch(() => {
        this.kernel = undefined;
      });
    }
    return this.kernel;
  }

  private vcpusOf(resources: SandboxResources): number {
    return Math.max(1, Math.ceil(resources.cpuCount));
  }

  /**
   * The template's snapshot for these resources, built once (shared by the agents of a host, file-locked): boot,
   * wait for envd, save memory and disk state.
   */
  async ensureSnapshot(template: TemplateImage, resources: SandboxResources): Promise<TemplateSnapshot> {
    const kernel = await this.guestKernel();
    const root = await ensureRootImage(this.images, template, resources.diskMiB);
    const vcpus = this.vcpusOf(resources);
    const cmdline = createHash("sha256").update(kernelCmdline(this.options.accel)).digest("hex").slice(0, 8);
    const name = `${template.templateId}-${root.key}-${kernel.version}-${cmdline}-${this.options.accel}-m${resources.memoryMiB}-c${vcpus}`;
    const dir = join(this.options.imageDir, "snapshots", name);
    const snapshot = {
      dir,
      disk: join(dir, "disk.qcow2"),
      memory: join(dir, "memory.snap"),
      memoryMiB: resources.memoryMiB,
      vcpus,
    };
    if (existsSync(join(dir, "READY"))) return snapshot;
    return withFileLock(join(this.options.imageDir, "locks", `snapshot-${template.templateId}.lock`), async () => {
      if (existsSync(join(dir, "READY"))) return snapshot;
      const log = this.options.log.child({ templateId: template.templateId, snapshot: name });
      // A short build directory: QEMU's unix sockets live in it (108-byte limit on socket paths).
      const tmp = join(this.options.imageDir, "snapshots", `.build-${process.pid}`);
      const started = Date.now();
      const slot = await this.network.acquire();
      try {
        await rm(tmp, { recursive: true, force: true });
        await mkdir(tmp, { recursive: true });
        const launch: VmLaunch = {
          name: `warren-snapshot-${template.templateId}`,
          dir: tmp,
          netnsPath: slot.netnsPath,
          kernel,
          disk: join(tmp, "disk.qcow2"),
          memoryMiB: resources.memoryMiB,
          vcpus,
          accel: this.options.accel,
        };
        const { pid, startTime } = await this.coldBoot(launch, slot, root.path, log);
        try {
          // envd warms itself up right after listening (one `bash -l -c true`); let that finish before saving.
          await new Promise((resolve) => setTimeout(resolve, 2000));
          await snapshotAndQuit(join(tmp, "qmp.sock"), join(tmp, "memory.snap"), SNAPSHOT_TIMEOUT_MS);
          await waitGone(pid, startTime, 10_000);
        } finally {
          await killVm(pid, startTime);
        }
        await rm(join(tmp, "qmp.sock"), { force: true });
        await writeFile(join(tmp, "READY"), new Date().toISOString());
        await rm(dir, { recursive: true, force: true });
        await rename(tmp, dir);
        log.info("template snapshot built", {
          seconds: Math.round((Date.now() - started) / 100) / 10,
          memoryMiB: Math.round((await stat(snapshot.memory)).size / 2 ** 20),
        });
        return snapshot;
      } catch (error) {
        await rm(tmp, { recursive: true, force: true });
        throw error;
      } finally {
        await this.network.release(slot);
      }
    });
  }

  /**
   * Boots a VM from scratch with a deadline per attempt; a hung boot (TCG, RUNTIME-NOTES §3.4; see qemu.ts kernelCmdline) is killed and retried
   * over a fresh disk layer. `base` given: the disk is (re)made as a qcow2 over it; absent: the disk is kept.
   */
  private async coldBoot(
    launch: VmLaunch,
    slot: VmNetworkSlot,
    base: string | undefined,
    log: Logger,
  ): Promise<{ pid: number; startTime: string }> {
    const attempts = this.options.bootAttempts ?? (this.options.accel === "kvm" ? 3 : 4);
    let lastError: Error | undefined;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      if (base) {
        await rm(launch.disk, { force: true });
        await exec("qemu-img", ["create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", launch.disk]);
      }
      const started = Date.now();
      const consoleLog = join(launch.dir, "console.log");
      const consoleFrom = await stat(consoleLog).then(
        (st) => st.size,
        () => 0,
      );
      const pid = await launchVm(launch);
      const startTime = (await processStartTime(pid)) ?? "";
      try {
        // Two deadlines: a boot that hangs in the kernel (TCG here: no guest output at all) is given up on once
        // the guest init has not started within the first; a slow envd start still has the whole boot deadline.
        await waitGuestInit(consoleLog, consoleFrom, this.initTimeoutMs, pid, startTime);
        await waitHealthy(
          slot.sandboxAddr,
          Math.max(1000, this.bootTimeoutMs - (Date.now() - started)),
          pid,
          startTime,
        );
        log.info("microVM booted", { attempt, ms: Date.now() - started, accel: this.options.accel });
        return { pid, startTime };
      } catch (error) {
        lastError = error as Error;
        const console = (await readFile(join(launch.dir, "console.log"), "utf8").catch(() => "")).slice(-300);
        log.warn("microVM boot failed; retrying", { attempt, error: lastError.message, console });
        await killVm(pid, startTime);
      }
    }
    throw new Error(`microVM did not boot in ${attempts} attempts: ${lastError?.message}`);
  }

  async create(spec: InstanceSpec): Promise<Instance> {
    if (spec.command) throw new Error("the microvm driver does not run custom start commands");
    const instanceId = `v${randomBytes(6).toString("hex")}`;
    const log = this.options.log.child({ instanceId, templateId: spec.template.templateId });
    const dir = this.instanceDir(instanceId);
    let record: InstanceRecord | undefined;
    let slot: VmNetworkSlot | undefined;
    try {
      // Snapshots are made with the template's default resources (a BuiltTemplate carries its recipe).
      const defaults = (spec.template as { recipe?: { defaults?: SandboxResources } }).recipe?.defaults;
      const template = spec.snapshotId
        ? undefined
        : await this.ensureSnapshot(spec.template, defaults ?? spec.resources);
      await mkdir(dir, { recursive: true });
      slot = await this.network.acquire();
      const draft: InstanceRecord = {
        instanceId,
        templateId: spec.template.templateId,
        templateHash: spec.template.hash,
        slot: slot.index,
        addr: slot.sandboxAddr,
        resources: spec.resources,
        vcpus: this.vcpusOf(spec.resources),
        createdAt: Date.now(),
        labels: { ...spec.labels },
        paused: false,
      };
      const register = async () => {
        // On disk before anything else exists, so a crash at any later step is cleaned up by reconcile.
        await this.persist(draft);
        this.instances.set(instanceId, draft);
        record = draft;
      };
      let base: { disk: string; memory?: string };
      if (template) {
        draft.snapshotDir = template.dir;
        await register();
        const exact = template.memoryMiB === spec.resources.memoryMiB && template.vcpus === draft.vcpus;
        base = { disk: template.disk, ...(exact ? { memory: template.memory } : {}) };
      } else {
        base = await this.useSnapshot(spec, draft, register);
      }
      const disk = join(dir, "disk.qcow2");
      await exec("qemu-img", ["create", "-q", "-f", "qcow2", "-b", base.disk, "-F", "qcow2", disk]);
      const started = performance.now();
      if (base.memory) {
        await this.restore(draft, base.memory);
      } else {
        // Other memory or vCPUs than the snapshot's, or a files-only snapshot: a cold boot over the disk layer.
        const booted = await this.coldBoot(this.launchOf(draft, await this.guestKernel()), slot, undefined, log);
        draft.pid = booted.pid;
        draft.pidStartTime = booted.startTime;
        await this.persist(draft);
      }
      log.debug("instance started", {
        fromMemory: base.memory !== undefined,
        ms: Math.round(performance.now() - started),
      });
      return this.toInstance(draft);
    } catch (error) {
      log.warn("instance start failed; removing it", { error });
      if (record) await this.teardown(record).catch((e) => log.error("cleanup failed", { error: e }));
      else {
        if (slot) await this.network.release(slot).catch(() => undefined);
        await rm(dir, { recursive: true, force: true });
      }
      throw error;
    }
  }

  /**
   * Checks that `spec` can start from its sandbox snapshot and registers the instance as a user of it, both under
   * the snapshots' lock: a concurrent deleteSnapshot then sees the instance and keeps the files it is layered on.
   */
  private useSnapshot(
    spec: InstanceSpec,
    draft: InstanceRecord,
    register: () => Promise<void>,
  ): Promise<{ disk: string; memory?: string }> {
    const snapshotId = spec.snapshotId ?? "";
    return this.snapshots.exclusive(async () => {
      const meta = await this.snapshots.read(snapshotId);
      if (!meta) throw new Error(`snapshot '${snapshotId}' does not exist on this node`);
      const problem = startProblem(meta, this.name, spec.template, spec.resources, draft.vcpus);
      if (problem) throw new Error(problem);
      // The disk layer's size is the snapshot's, whatever was asked for.
      draft.resources = { ...spec.resources, diskMiB: meta.resources.diskMiB };
      draft.fromSnapshot = snapshotId;
      await register();
      return {
        disk: this.snapshots.disk(snapshotId),
        ...(meta.memory ? { memory: this.snapshots.memory(snapshotId) } : {}),
      };
    });
  }

  private launchOf(record: InstanceRecord, kernel: GuestKernel, incoming?: string): VmLaunch {
    return {
      name: `warren-${this.options.instance}-${record.instanceId}`,
      dir: this.instanceDir(record.instanceId),
      netnsPath: this.network.slot(record.slot).netnsPath,
      kernel,
      disk: join(this.instanceDir(record.instanceId), "disk.qcow2"),
      memoryMiB: record.resources.memoryMiB,
      vcpus: record.vcpus,
      accel: this.options.accel,
      ...(incoming ? { incoming } : {}),
    };
  }

  /** New QEMU loading `memory` (a template snapshot or the instance's checkpoint), resumed, envd answering. */
  private async restore(record: InstanceRecord, memory: string): Promise<void> {
    const kernel = await this.guestKernel();
    const pid = await launchVm(this.launchOf(record, kernel, memory));
    record.pid = pid;
    record.pidStartTime = await processStartTime(pid);
    await this.persist(record);
    try {
      await finishRestore(join(this.instanceDir(record.instanceId), "qmp.sock"), this.options.readyTimeoutMs);
      await this.syncClock(record);
      await waitHealthy(record.addr, this.options.readyTimeoutMs, pid, record.pidStartTime ?? "");
    } catch (error) {
      await killVm(pid, record.pidStartTime);
      throw error;
    }
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
      };
    });
    if (state === "running") await this.syncClock(record);
    this.options.log.info("sandbox snapshot taken", {
      instanceId,
      snapshotId,
      state,
      memory: meta.memory,
      sizeBytes: meta.sizeBytes,
    });
    const { vcpus: _v, parent: _p, sourceInstanceId: _s, ...image } = meta;
    return image;
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.snapshots.delete(snapshotId);
  }

  listSnapshots(): Promise<SnapshotImage[]> {
    return this.snapshots.list();
  }

  /** Ids of the sandbox snapshots instance disks are layered on: live instances and every record on disk. */
  private async snapshotReferences(): Promise<Set<string>> {
    const refs = new Set<string>();
    for (const record of this.instances.values()) if (record.fromSnapshot) refs.add(record.fromSnapshot);
    for (const name of existsSync(this.instancesDir) ? await readdir(this.instancesDir) : []) {
      const record = await this.load(name);
      if (record?.fromSnapshot) refs.add(record.fromSnapshot);
    }
    return refs;
  }

  async pause(instanceId: string): Promise<void> {
    const record = this.require(instanceId);
    await withQmp(this.qmpPath(record), (qmp) => qmp.execute("stop"));
    record.paused = true;
    await this.persist(record);
  }

  async checkpoint(instanceId: string): Promise<CheckpointResult> {
    const record = this.require(instanceId);
    if (!record.paused || record.checkpointed || record.stopped || record.pid === undefined) {
      throw new Error(`instance '${instanceId}' is not paused in memory`);
    }
    const memoryBeforeBytes = (await processUsage(record.pid)).rssBytes;
    const path = join(this.instanceDir(instanceId), "memory.snap");
    const tmp = `${path}.tmp`;
    if (record.pausedImage) {
      // The memory is saved already (a snapshot while paused); QEMU, in `postmigrate`, could not save it again.
      await rename(join(this.instanceDir(instanceId), "memory.paused"), tmp);
      await killVm(record.pid, record.pidStartTime);
    } else {
      try {
        await snapshotAndQuit(this.qmpPath(record), tmp, SNAPSHOT_TIMEOUT_MS);
      } catch (error) {
        await rm(tmp, { force: true });
        // QEMU is still there with stopped vCPUs (a failed migration leaves the source as it was): still paused.
        throw error;
      }
      await waitGone(record.pid, record.pidStartTime ?? "", 10_000);
      await killVm(record.pid, record.pidStartTime);
    }
    await rename(tmp, path);
    record.pausedImage = false;
    record.checkpointed = true;
    record.pid = undefined;
    record.pidStartTime = undefined;
    await this.persist(record);
    return { imageBytes: (await stat(path)).size, memoryBeforeBytes, memoryAfterBytes: 0 };
  }

  async resume(instanceId: string): Promise<ResumeResult> {
    const record = this.require(instanceId);
    if (record.stopped) throw new Error(`instance '${instanceId}' was stopped (filesystem-only pause): reboot it`);
    if (record.checkpointed) {
      const path = join(this.instanceDir(instanceId), "memory.snap");
      // On failure the checkpoint stays: the sandbox is still paused and the resume can be retried.
      await this.restore(record, path);
      record.checkpointed = false;
      record.paused = false;
      await this.persist(record);
      await rm(path, { force: true });
      return { tier: "checkpoint" };
    }
    await withQmp(this.qmpPath(record), (qmp) => qmp.execute("cont"));
    await this.syncClock(record);
    record.paused = false;
    await this.forgetPausedImage(record);
    return { tier: "freezer" };
  }

  /**
   * Filesystem-only pause: QEMU ends, the disk stays. The guest first ends its processes and flushes its page
   * cache (vCPUs run for that moment if the VM was paused): files written just before the pause are on the disk
   * a reboot mounts, and clients see their connections closed rather than silently dead.
   */
  async stop(instanceId: string): Promise<void> {
    const record = this.require(instanceId);
    if (record.pid !== undefined && (await processStartTime(record.pid)) === record.pidStartTime) {
      const synced = await withQmp(this.qmpPath(record), (qmp) => qmp.execute("cont"))
        .then(() => stopGuest(join(this.instanceDir(instanceId), "console.sock"), 10_000))
        .catch(() => false);
      if (!synced) this.options.log.warn("the guest did not confirm its shutdown before stop", { instanceId });
      // QEMU exits by itself once PID 1 has gone (see guest-image.ts); SIGKILL below only if it has not.
      else await waitGone(record.pid, record.pidStartTime ?? "", 5_000);
    }
    await killVm(record.pid, record.pidStartTime);
    await rm(join(this.instanceDir(instanceId), "memory.snap"), { force: true });
    record.pid = undefined;
    record.pidStartTime = undefined;
    record.checkpointed = false;
    record.stopped = true;
    record.paused = true;
    await this.forgetPausedImage(record);
  }

  /** The guest ran on (or ended): `memory.paused` no longer holds its memory. Persists the record. */
  private async forgetPausedImage(record: InstanceRecord): Promise<void> {
    record.pausedImage = false;
    await this.persist(record);
    await rm(join(this.instanceDir(record.instanceId), "memory.paused"), { force: true });
  }

  async reboot(instanceId: string): Promise<Instance> {
    const record = this.require(instanceId);
    await this.stop(instanceId);
    const kernel = await this.guestKernel();
    const { pid, startTime } = await this.coldBoot(
      this.launchOf(record, kernel),
      this.network.slot(record.slot),
      undefined,
      this.options.log.child({ instanceId }),
    );
    record.pid = pid;
    record.pidStartTime = startTime;
    record.stopped = false;
    record.paused = false;
    await this.persist(record);
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

  /** Host-side view: QEMU's resident memory and CPU time, the disk layer's allocated bytes. */
  async stats(instanceId: string): Promise<InstanceStats> {
    const record = this.require(instanceId);
    const usage = record.pid !== undefined ? await processUsage(record.pid) : { rssBytes: 0, cpuUsec: 0 };
    const disk = await stat(join(this.instanceDir(instanceId), "disk.qcow2")).catch(() => undefined);
    return {
      memoryUsageBytes: usage.rssBytes,
      memoryLimitBytes: record.resources.memoryMiB * 2 ** 20,
      cpuUsageUsec: usage.cpuUsec,
      pids: 0,
      pidsLimit: record.resources.pidsMax,
      diskUsageBytes: disk ? disk.blocks * 512 : 0,
      diskLimitBytes: record.resources.diskMiB * 2 ** 20,
    };
  }

  async reconcile(): Promise<ReconcileResult> {
    const adopted: Instance[] = [];
    const removed: { instanceId: string; labels: Record<string, string> }[] = [];
    const names = existsSync(this.instancesDir) ? await readdir(this.instancesDir) : [];
    for (const name of names) {
      const record = await this.load(name);
      if (!record) {
        await this.killStray(name);
        await rm(this.instanceDir(name), { recursive: true, force: true });
        continue;
      }
      const netns = existsSync(this.network.slot(record.slot).netnsPath);
      const alive = record.pid !== undefined && (await processStartTime(record.pid)) === record.pidStartTime;
      if (alive && !record.paused) await this.continueInterruptedSnapshot(record);
      const running = alive && (record.paused || (await healthyOnce(record.addr, 2000)));
      const checkpointed = record.checkpointed === true && existsSync(join(this.instanceDir(name), "memory.snap"));
      const stopped = record.stopped === true;
      if (netns && (running || checkpointed || stopped)) {
        this.instances.set(name, record);
        this.network.reserve(record.slot);
        adopted.push(this.toInstance(record));
      } else {
        this.options.log.warn("removing dead microVM instance found at start", { instanceId: name });
        await this.teardown(record);
        removed.push({ instanceId: name, labels: record.labels });
      }
    }
    await this.network.sweep(new Set([...this.instances.values()].map((r) => r.slot)));
    // Deleted snapshots whose last user was removed above (or killed while the agent was down).
    await this.snapshots.sweep({ tmp: true });
    return { adopted, removed };
  }

  async close(): Promise<void> {}

  /** An agent that died while snapshotting a running instance left its vCPUs stopped: they run on. */
  private async continueInterruptedSnapshot(record: InstanceRecord): Promise<void> {
    await withQmp(this.qmpPath(record), async (qmp) => {
      const status = await queryStatus(qmp);
      if (status === "paused" || status === "postmigrate" || status === "finish-migrate") await qmp.execute("cont");
    }).catch(() => undefined);
  }

  /** A directory without a readable record may still have a QEMU (crash between launch and persist). */
  private async killStray(instanceId: string): Promise<void> {
    const pidText = await readFile(join(this.instanceDir(instanceId), "qemu.pid"), "utf8").catch(() => "");
    const pid = Number(pidText.trim());
    if (!Number.isInteger(pid) || pid <= 0) return;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmdline.includes(this.instanceDir(instanceId))) await killVm(pid, await processStartTime(pid));
  }

  /**
   * Removes everything an instance has, from any partial state: QEMU, network namespace, veth, files; then a
   * deleted snapshot it was the last user of.
   */
  private async teardown(record: InstanceRecord): Promise<void> {
    await killVm(record.pid, record.pidStartTime);
    await this.killStray(record.instanceId);
    await this.network.release(this.network.slot(record.slot));
    this.instances.delete(record.instanceId);
    await rm(this.instanceDir(record.instanceId), { recursive: true, force: true });
    if (record.fromSnapshot) await this.snapshots.sweep();
  }

  /** The guest's wall clock := the host's, before anyone uses the sandbox (see guest-image.ts for why). */
  private async syncClock(record: InstanceRecord): Promise<void> {
    const console = join(this.instanceDir(record.instanceId), "console.sock");
    if (!(await syncGuestClock(console, this.options.accel === "kvm" ? 2000 : 10_000))) {
      this.options.log.warn("the guest did not confirm its clock", { instanceId: record.instanceId });
    }
  }

  private qmpPath(record: InstanceRecord): string {
    return join(this.instanceDir(record.instanceId), "qmp.sock");
  }

  private require(instanceId: string): InstanceRecord {
    const record = this.instances.get(instanceId);
    if (!record) throw new Error(`no instance '${instanceId}'`);
    return record;
  }

  private toInstance(record: InstanceRecord): Instance {
    return {
      instanceId: record.instanceId,
      templateId: record.templateId,
      templateHash: record.templateHash,
      addr: record.addr,
      envdUrl: `http://${record.addr}:${ENVD_PORT}`,
      resources: record.resources,
      createdAt: record.createdAt,
      labels: { ...record.labels },
      paused: record.paused,
      checkpointed: record.checkpointed === true,
      stopped: record.stopped === true,
    };
  }

  private async persist(record: InstanceRecord): Promise<void> {
    const path = join(this.instanceDir(record.instanceId), "instance.json");
    await writeFile(`${path}.tmp`, JSON.stringify(record));
    await rename(`${path}.tmp`, path);
  }

  private async load(instanceId: string): Promise<InstanceRecord | undefined> {
    try {
      const record = JSON.parse(
        await readFile(join(this.instanceDir(instanceId), "instance.json"), "utf8"),
      ) as InstanceRecord;
      return record.instanceId === instanceId ? record : undefined;
    } catch {
      return undefined;
    }
  }
}

function healthyOnce(addr: string, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request(
      { host: addr, port: ENVD_PORT, path: "/health", method: "GET", agent: false, timeout: timeoutMs },
      (res) => {
        res.resume();
        resolve((res.statusCode ?? 500) < 300);
      },
    );
    req.once("timeout", () => req.destroy());
    req.once("error", () => resolve(false));
    req.end();
  });
}

/** Polls envd's /health until it answers, QEMU dies, or the deadline passes. */
async function waitHealthy(addr: string, timeoutMs: number, pid: number, startTime: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    if (await healthyOnce(addr, 1000)) return;
    if ((await processStartTime(pid)) !== startTime) throw new Error("QEMU exited before envd answered");
    if (Date.now() > deadline) throw new Error(`envd did not answer within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, attempt < 50 ? 10 : 100));
  }
}

/** Waits until the guest init's marker appears in the console log past `from` (this boot's output). */
async function waitGuestInit(path: string, from: number, timeoutMs: number, pid: number, startTime: string) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = await readFile(path).then(
      (b) => b.subarray(from).toString("utf8"),
      () => "",
    );
    if (text.includes("WARREN-GUEST-INIT")) return;
    if ((await processStartTime(pid)) !== startTime) throw new Error(`QEMU exited during boot: ${text.slice(-200)}`);
    if (Date.now() > deadline) throw new Error(`the guest init did not start within ${timeoutMs} ms (boot hung)`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
