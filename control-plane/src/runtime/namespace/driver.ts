import { randomBytes } from "node:crypto";
import { mkdir, open, rm, statfs } from "node:fs/promises";
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
  SnapshotLayers,
  SnapshotOptions,
  TemplateImage,
} from "../driver.js";
import { CLOSED_EGRESS, compileEgress, type EgressPolicy } from "../egress/policy.js";
import { envdLauncherPath } from "../exec.js";
import { DEFAULT_LOG_CAP, LogCap, type LogCapLimits } from "../log-cap.js";
import { processStartTime, processState } from "../sandbox-process.js";
import { type CgroupManager, detectCgroupManager, favorDynamicModifications } from "./cgroups.js";
import { DiskBudget } from "./disk-budget.js";
import { InstanceContainers } from "./instance-container.js";
import { type InstanceRecord, InstanceRecords, newInstanceRecord, toInstance } from "./instance-records.js";
import { InstanceSnapshots } from "./instance-snapshots.js";
import { KernelOomLog } from "./kernel-oom-log.js";
import { unmountTree } from "./mounts.js";
import { NetworkPool, type NetworkSlot } from "./network.js";
import { PauseTiers } from "./pause-tiers.js";
import { QuietReclaim } from "./quiet-reclaim.js";
import { reconcileInstances } from "./reconcile.js";
import { type DiskKind, SandboxDisks } from "./sandbox-disks.js";
import { SandboxEgress } from "./sandbox-egress.js";

/**
 * The `namespace` runtime driver: Linux namespaces (user, mount, pid, net, ipc, uts, cgroup) started by crun,
 * an overlayfs root over the template's read-only rootfs, cgroup limits (v1 or v2), a seccomp filter, and a
 * pre-made network namespace per sandbox.
 *
 * Why crun, not bubblewrap (RUNTIME-NOTES §2.3 recommends bwrap for speed): bwrap 0.8 always sets
 * no-new-privileges and can map only one uid into a user namespace. E2B templates give `user` passwordless sudo
 * (the SDK's tests use it), and sudo is setuid, which no-new-privileges disables. crun (Debian, C, ~10 ms to
 * start a container here) maps a whole uid range, leaves no-new-privileges to the spec, compiles the seccomp
 * filter with libseccomp, and joins a pre-made network namespace.
 *
 * Security model (user namespace, sudo and no-new-privileges):
 * - sandbox uids 0..65535 map to host uids uidBase.. (default 100000..165535); template files were chowned into
 *   that range when the template was built. Sandbox root is host uid 100000: no capability outside the sandbox's
 *   own namespaces, so `sudo` inside yields only sandbox root.
 * - no-new-privileges is OFF for templates that ship sudo (`allowSetuid`), because setuid is how sudo works; it is
 *   ON for every template that does not need setuid. What NNP would protect against (a setuid binary gaining
 *   host privilege) cannot happen here: setuid only reaches sandbox root, whose capabilities are those of
 *   oci-spec.ts SANDBOX_CAPABILITIES in namespaces the sandbox owns, under the seccomp filter (seccomp.ts:
 *   no mount, unshare, setns, modules, kexec, reboot, swap, bpf, perf, keyring, clock changes).
 * - the network namespace is owned by the host's user namespace, so sandbox root cannot reconfigure it.
 *
 * Process tree (for a later CRIU checkpoint, RUNTIME-NOTES §2.8): the launcher (sh) joins the cgroups, mounts
 * the overlay and execs `crun run --detach`; crun exits once the sandbox runs, so the sandbox's PID 1 (tini,
 * reaping orphans) is re-parented away from the agent: no PDEATHSIG, no --die-with-parent, and sandboxes
 * survive an agent crash (reconcile() re-adopts them). envd runs under tini; envd starts every process as a
 * session leader. Code templates (`codeGateway`) put a shell between tini and envd that first starts the code
 * gateway in a session of its own (SANDBOX_INIT); CRIU checkpoints and restores that tree too, kernels and
 * their ZeroMQ IPC sockets included (e2e/test/code-interpreter.test.ts).
 *
 * Disk quota: the writable layer (upper + work dirs of the overlay) is an ext4 filesystem of the sandbox's disk
 * size in a sparse image file on the node's disk, loop-mounted (sandbox-disks.ts): filling it is ENOSPC for the
 * writer, and memory is charged only page cache for it. Where the start-up probe cannot loop-mount an image, it is
 * a size-limited tmpfs, whose pages count against the memory limit.
 *
 * The parts: instance-container.ts (bundle, launcher, crun, ready wait), pause-tiers.ts (freezer, CRIU checkpoint,
 * stop, reboot), instance-snapshots.ts (layer + memory snapshots), sandbox-egress.ts (gateway and firewalls),
 * reconcile.ts (adoption after a restart), instance-records.ts (the on-disk records). This class owns the live
 * instances, their cgroups and network slots, and the order in which an instance is built and torn down.
 */
export interface NamespaceDriverOptions {
  readonly stateDir: string;
  /** Tag separating this agent's names (netns, veth, cgroups, chains) from another agent's on the host. */
  readonly instance: string;
  readonly netCidr: string;
  readonly netPoolSize: number;
  /** The cap on each sandbox's envd.log (log-cap.ts; default DEFAULT_LOG_CAP). */
  readonly logCap?: LogCapLimits;
  readonly uidBase: number;
  /** The host's node binary, bind-mounted read-only into sandboxes for envd (instance-container.ts ENVD_NODE). */
  readonly nodeBinary: string;
  /** Directory holding envd/, proto/ and node_modules/ (the repository root), bind-mounted read-only. */
  readonly envdRoot: string;
  readonly readyTimeoutMs: number;
  readonly log: Logger;
  /**
   * CRIU 4 (a wrapper that runs it from a side root, scripts/setup-host.sh); without it there is no checkpoint
   * tier and paused sandboxes stay frozen in memory.
   */
  readonly criu?: string;
  /** Upstream DNS server (`ip` or `ip:port`) of the egress gateway; default: the node's resolv.conf. */
  readonly dnsUpstream?: string;
  /** See NetworkPoolOptions.uplinkForwarding (default on). */
  readonly uplinkForwarding?: boolean;
  /** How many times its free disk the node may promise to sandbox disks (disk-budget.ts; default 1). */
  readonly diskOvercommit?: number;
}

/**
 * A killed sandbox's teardown waits for this long without a create or kill (quiet-reclaim.ts), at most
 * RECLAIM_MAX_DELAY_MS: 10 back-to-back creates from a warm pool, create → first command p50 79–97 → 56 / 64 ms
 * with the teardowns out of their way (2026-12-05, `bench:pools --quick`, round 2).
 */
const RECLAIM_QUIET_MS = 250;
const RECLAIM_MAX_DELAY_MS = 2000;

export class NamespaceDriver implements RuntimeDriver {
  readonly name = "namespace";
  readonly mountsVolumes = true;
  readonly envdInitTimeoutMs = 10_000;
  private readonly instances = new Map<string, InstanceRecord>();
  private readonly cgroups: CgroupManager;
  readonly network: NetworkPool;
  private readonly records: InstanceRecords;
  private readonly crunRoot: string;
  private readonly containers: InstanceContainers;
  private readonly tiers: PauseTiers;
  private readonly snapshots: InstanceSnapshots;
  private readonly egress: SandboxEgress;
  /** Keeps each sandbox's envd.log (PID 1's stdout/stderr, writable by the sandbox) under its cap. */
  private readonly logCap: LogCap;
  /** Teardowns of killed instances (kill with `reclaimLater`), run in the node's quiet moments. */
  private readonly reclaims: QuietReclaim<InstanceRecord>;
  private readonly disks: SandboxDisks;
  private readonly diskBudget: DiskBudget;
  /** The kernel's OOM reports, which name the processes the cgroup counters only count. */
  private readonly oomLog: KernelOomLog;

  constructor(private readonly options: NamespaceDriverOptions) {
    this.cgroups = detectCgroupManager(`warren/${options.instance}`);
    this.network = new NetworkPool({
      instance: options.instance,
      cidr: options.netCidr,
      poolSize: options.netPoolSize,
      log: options.log,
      ...(options.uplinkForwarding === false ? { uplinkForwarding: false } : {}),
      launcher: envdLauncherPath(options.envdRoot),
    });
    this.records = new InstanceRecords(join(options.stateDir, "instances"));
    this.crunRoot = join(options.stateDir, "crun");
    const { records, cgroups, network } = this;
    const { criu, uidBase, log } = options;
    this.disks = new SandboxDisks(
      join(options.stateDir, "disks"),
      uidBase,
      log.child({ part: "disks" }),
      envdLauncherPath(options.envdRoot),
    );
    this.diskBudget = new DiskBudget(options.stateDir, options.diskOvercommit ?? 1);
    this.oomLog = new KernelOomLog(log.child({ part: "oom-log" }));
    this.reclaims = new QuietReclaim({ quietMs: RECLAIM_QUIET_MS, maxDelayMs: RECLAIM_MAX_DELAY_MS }, (record) =>
      this.teardown(record).catch((error: unknown) =>
        log.error("reclaiming a killed instance failed", { instanceId: record.instanceId, error }),
      ),
    );
    const containers = new InstanceContainers({
      instance: options.instance,
      crunRoot: this.crunRoot,
      records,
      uidBase,
      nodeBinary: options.nodeBinary,
      envdRoot: options.envdRoot,
      readyTimeoutMs: options.readyTimeoutMs,
      disks: this.disks,
    });
    const tiers = new PauseTiers({ records, containers, cgroups, network, criu, uidBase, log });
    const instances = this.instances;
    this.snapshots = new InstanceSnapshots({
      stateDir: options.stateDir,
      instances,
      records,
      containers,
      tiers,
      cgroups,
      network,
      criu,
      log,
    });
    this.containers = containers;
    this.tiers = tiers;
    this.egress = new SandboxEgress(network, options);
    this.logCap = new LogCap(
      () => [...this.instances.keys()].map((id) => join(this.instanceDir(id), "envd.log")),
      options.logCap ?? DEFAULT_LOG_CAP,
      options.log.child({ part: "log-cap" }),
    );
  }

  get cgroupVersion(): 1 | 2 {
    return this.cgroups.version;
  }

  /** How writable layers are stored on this node (the start-up probe's choice; tests assert what the host has). */
  get diskKind(): DiskKind {
    return this.disks.kind;
  }

  /** The directory of an instance's files and mounts (tests inspect it). */
  instanceDir(instanceId: string): string {
    return this.records.dir(instanceId);
  }

  containerId(instanceId: string): string {
    return this.containers.containerId(instanceId);
  }

  async start(): Promise<void> {
    await mkdir(this.records.root, { recursive: true });
    await mkdir(this.crunRoot, { recursive: true });
    await this.snapshots.start();
    await this.cgroups.prepare();
    const slowMoves = await favorDynamicModifications();
    if (slowMoves) {
      this.options.log.warn("moving processes between cgroups stays slow (no favordynmods)", { error: slowMoves });
    }
    await this.network.start();
    await this.egress.start();
    await this.tiers.probe();
    await this.disks.probe();
    this.logCap.start();
  }

  /** Starts refilling the network pool (after reconcile, so adopted slots are known). */
  startPools(): void {
    this.network.refill();
  }

  async create(spec: InstanceSpec): Promise<Instance> {
    this.reclaims.activity();
    const instanceId = `i${randomBytes(6).toString("hex")}`;
    const log = this.options.log.child({ instanceId, templateId: spec.template.templateId });
    const dir = this.instanceDir(instanceId);
    await mkdir(join(dir, "bundle"), { recursive: true });
    let slot: NetworkSlot | undefined;
    let record: InstanceRecord | undefined;
    const base = spec.snapshotId ? await this.snapshots.pin(spec.snapshotId) : undefined;
    try {
      if (base && base.snapshot.templateHash !== spec.template.hash) {
        throw new Error(
          `snapshot '${spec.snapshotId}' was made from another build of template '${base.snapshot.templateId}'`,
        );
      }
      slot = await this.network.acquire();
      record = newInstanceRecord(instanceId, spec, slot, base?.snapshot);
      // The record goes to disk before anything else exists, so a crash at any later step is cleaned up.
      await this.records.persist(record);
      this.instances.set(instanceId, record);
      await this.admitDisk(record);
      const background = () => spec.background === true && spec.promoted?.() !== true;
      const cgroup = await this.cgroups.create(instanceId, spec.resources, { background: background() });
      spec.onInstance?.(instanceId);
      await this.containers.writeFiles(record, slot, spec.command, background() ? "now" : "after-init");
      await this.egress.apply(record);
      const launchAt = performance.now();
      const memory = base?.snapshot.criu;
      if (memory && spec.snapshotId) {
        // The snapshot's processes continue here: same boot, this instance's root, network and cgroups.
        await this.snapshots.startFromMemory(record, cgroup, spec.snapshotId, memory);
      } else {
        await this.containers.launch(record, cgroup);
      }
      const readyAt = performance.now();
      if (!memory) await this.containers.waitReady(record, cgroup, log);
      log.debug("instance ready", {
        addr: record.addr,
        launchMs: Math.round(readyAt - launchAt),
        envdStartMs: Math.round(performance.now() - readyAt),
      });
      return toInstance(record);
    } catch (error) {
      log.warn("instance start failed; removing it", { error });
      if (record)
        await this.teardown(record).catch((e) => log.error("cleanup after failed start failed", { error: e }));
      else {
        if (slot) await this.network.release(slot).catch(() => undefined);
        await rm(dir, { recursive: true, force: true });
      }
      throw error;
    } finally {
      base?.release();
    }
  }

  /**
   * Refuses (DiskBudgetExceeded) a disk the node cannot promise beside those of its other instances, counted while
   * they are being made too (an image not there yet may still take all of its size). A tmpfs layer is memory.
   * Ready disks are no promise until a create takes one (and is admitted here first): until then they hold only
   * their filesystems' metadata.
   */
  private async admitDisk(record: InstanceRecord): Promise<void> {
    if (this.disks.kind !== "image") return;
    const promised = [...this.instances.values()]
      .filter((other) => other.instanceId !== record.instanceId)
      .map((other) => ({
        image: join(this.instanceDir(other.instanceId), "disk.img"),
        sizeBytes: other.resources.diskSizeMB * 2 ** 20,
      }));
    await this.diskBudget.admit(record.resources.diskSizeMB * 2 ** 20, promised);
  }

  /** See InstanceSnapshots.capture: a running sandbox is frozen for the copy and runs on, a paused one stays paused. */
  async snapshot(instanceId: string, snapshotId: string, options: SnapshotOptions = {}): Promise<SnapshotImage> {
    return this.snapshots.capture(this.require(instanceId), snapshotId, options.filesOnly === true);
  }

  async snapshotFromDirectory(
    snapshotId: string,
    template: TemplateImage,
    dir: string,
    resources: SandboxResources,
  ): Promise<SnapshotImage> {
    return this.snapshots.captureDirectory(snapshotId, template, dir, resources);
  }

  async flattenSnapshot(snapshotId: string, template: TemplateImage, dest: string): Promise<void> {
    return this.snapshots.flatten(snapshotId, template, dest);
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    return this.snapshots.delete(snapshotId);
  }

  async listSnapshots(): Promise<SnapshotImage[]> {
    return this.snapshots.list();
  }

  exportSnapshot(snapshotId: string, omitLayers?: ReadonlySet<string>): AsyncIterable<Uint8Array> {
    return this.snapshots.export(snapshotId, omitLayers);
  }

  get snapshotLayers(): SnapshotLayers {
    return this.snapshots.layers;
  }

  async importSnapshot(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    return this.snapshots.import(snapshotId, data);
  }

  async label(instanceId: string, labels: Readonly<Record<string, string>>): Promise<Instance> {
    const record = this.require(instanceId);
    record.labels = { ...record.labels, ...labels };
    await this.records.persist(record);
    return toInstance(record);
  }

  async foreground(instanceId: string): Promise<void> {
    const record = this.require(instanceId);
    await this.cgroups.open(instanceId).foreground(record.resources.cpuCount);
  }

  async kill(instanceId: string, options: { readonly reclaimLater?: boolean } = {}): Promise<void> {
    const record = this.require(instanceId);
    if (!options.reclaimLater) return this.teardown(record);
    // What the caller waits for: every process killed (it never runs again; the teardown waits for its exit), the
    // instance forgotten (also by a restart: no record). The mounts, cgroups, network namespace, firewall rules and
    // files (~100 ms of umount, ip and iptables) follow.
    await this.cgroups.open(instanceId).killAll({ wait: false });
    this.instances.delete(instanceId);
    await this.records.forget(instanceId);
    // Once the node is quiet (RECLAIM_QUIET_MS without a create or kill, at most RECLAIM_MAX_DELAY_MS later): right
    // after a kill its ~100 ms of host tools would share the CPU with the next create and its first command.
    this.reclaims.add(record);
  }

  async settled(): Promise<void> {
    await this.reclaims.settled();
  }

  async pause(instanceId: string): Promise<void> {
    return this.tiers.pause(this.require(instanceId));
  }

  get canCheckpoint(): boolean {
    return this.tiers.canCheckpoint;
  }

  /** Memory goes into snapshots where CRIU works (the same dump as a checkpoint, leaving the sandbox running). */
  get snapshotsKeepMemory(): boolean {
    return this.canCheckpoint;
  }

  async checkpoint(instanceId: string): Promise<CheckpointResult> {
    return this.tiers.checkpoint(this.require(instanceId));
  }

  async stop(instanceId: string): Promise<void> {
    return this.tiers.stop(this.require(instanceId));
  }

  async reboot(instanceId: string): Promise<Instance> {
    const record = this.require(instanceId);
    await this.tiers.reboot(record);
    return toInstance(record);
  }

  async resume(instanceId: string): Promise<ResumeResult> {
    return this.tiers.resume(this.require(instanceId));
  }

  list(): Instance[] {
    return [...this.instances.values()].filter((r) => r.pid !== undefined).map((r) => toInstance(r));
  }

  async deathOf(instanceId: string): Promise<string | undefined> {
    const record = this.instances.get(instanceId);
    if (!record || record.paused || record.stopped || record.checkpoint || record.pid === undefined) return undefined;
    if ((await processStartTime(record.pid)) !== record.pidStartTime) return "its init process exited (envd died)";
    const state = await processState(record.pid);
    return state === "Z" || state === "X" ? "its init process exited (envd died)" : undefined;
  }

  async stats(instanceId: string): Promise<InstanceStats> {
    const record = this.require(instanceId);
    const usage = await this.cgroups.open(instanceId).usage();
    const fs = await statfs(join(this.instanceDir(instanceId), "disk"));
    return {
      memoryUsageBytes: usage.memoryBytes,
      memoryLimitBytes: usage.memoryLimitBytes,
      cpuUsageUsec: usage.cpuUsec,
      pids: usage.pids,
      pidsLimit: usage.pidsLimit,
      oomKills: usage.oomKills,
      oomVictims: this.oomLog
        .victimsUnder(this.memcgPath(instanceId))
        .map(({ process, memoryBytes, at }) => ({ process, memoryBytes, at })),
      diskUsageBytes: (fs.blocks - fs.bfree) * fs.bsize,
      // The size asked for: an ext4 disk's statfs leaves out its own metadata (inode tables, bitmaps).
      diskLimitBytes: record.resources.diskSizeMB * 2 ** 20,
    };
  }

  async reconcile(): Promise<ReconcileResult> {
    return reconcileInstances({
      instances: this.instances,
      records: this.records,
      containers: this.containers,
      cgroups: this.cgroups,
      network: this.network,
      egress: this.egress,
      snapshots: this.snapshots,
      teardown: (record) => this.teardown(record),
      log: this.options.log,
    });
  }

  /** The instance's memory cgroup as the kernel names it in its log. */
  private memcgPath(instanceId: string): string {
    return `/warren/${this.options.instance}/${instanceId}`;
  }

  async close(): Promise<void> {
    await this.settled();
    this.oomLog.close();
    this.logCap.close();
    await this.disks.close();
    await this.network.close();
    await this.egress.close();
    // Nothing of this agent is left on the node (a stop that killed every sandbox): neither are its chains.
    if (this.instances.size === 0) await this.network.removeChains();
  }

  /** Replaces the instance's egress policy: its namespace's firewall and the gateway's view, atomically each. */
  async setEgress(instanceId: string, policy: EgressPolicy): Promise<void> {
    const record = this.require(instanceId);
    const before = record.egress ?? CLOSED_EGRESS;
    if (compileEgress(before).key === compileEgress(policy).key) return;
    record.egress = policy;
    try {
      await this.egress.apply(record);
    } catch (error) {
      record.egress = before;
      await this.egress.apply(record).catch(() => undefined);
      throw error;
    }
    await this.records.persist(record);
  }

  async logTail(instanceId: string, maxBytes: number): Promise<string> {
    this.require(instanceId);
    const file = await open(join(this.instanceDir(instanceId), "envd.log"), "r");
    try {
      const { size } = await file.stat();
      const start = Math.max(0, size - maxBytes);
      const buf = Buffer.alloc(size - start);
      await file.read(buf, 0, buf.length, start);
      const text = buf.toString("utf8");
      // A cut first line is dropped rather than shown half.
      return start > 0 ? text.slice(text.indexOf("\n") + 1) : text;
    } finally {
      await file.close();
    }
  }

  /** The egress policy an instance has (tests and `getInfo` checks). */
  egressOf(instanceId: string): EgressPolicy {
    return this.require(instanceId).egress ?? CLOSED_EGRESS;
  }

  /** Removes everything an instance has, in an order that works from any partial state. */
  private async teardown(record: InstanceRecord): Promise<void> {
    const dir = this.instanceDir(record.instanceId);
    const cgroup = this.cgroups.open(record.instanceId);
    await cgroup.killAll();
    await this.containers.remove(record.instanceId);
    await unmountTree(dir);
    await cgroup.remove();
    this.egress.forget(record);
    await this.network.release(this.network.slot(record.slot));
    this.instances.delete(record.instanceId);
    this.oomLog.forget(this.memcgPath(record.instanceId));
    await rm(dir, { recursive: true, force: true });
    if (record.layers?.length || record.captureLayers?.length) await this.snapshots.collectLayers();
  }

  private require(instanceId: string): InstanceRecord {
    const record = this.instances.get(instanceId);
    if (!record) throw new Error(`no instance '${instanceId}'`);
    return record;
  }
}
