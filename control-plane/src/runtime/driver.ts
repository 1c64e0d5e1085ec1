import type { EgressPolicy } from "./egress/policy.js";

/**
 * The runtime driver interface: how the node agent starts, stops and inspects sandboxes, whatever isolates them.
 * `namespace` (Linux namespaces + overlayfs + cgroups + seccomp, ./namespace/) is the only driver today; a `microvm`
 * driver comes later behind the same interface, chosen by a capability probe.
 *
 * A driver knows nothing of sandbox ids, teams or routes: it runs *instances* (internal ids), and keeps, with each
 * instance's on-disk record, an opaque set of labels the agent attaches (the agent stores the sandbox binding
 * there, so both survive an agent crash together).
 */

/**
 * What a sandbox may use. Memory and disk carry E2B's names everywhere in Warren, from the REST body to the cgroup:
 * `memoryMB` and `diskSizeMB`, in E2B's megabytes, which are mebibytes (2^20 bytes).
 */
export interface SandboxResources {
  /** CPUs (CFS quota); may be fractional. */
  readonly cpuCount: number;
  readonly memoryMB: number;
  /** Writable layer quota. */
  readonly diskSizeMB: number;
  /** Max processes + threads. */
  readonly pidsMax: number;
}

/**
 * `value` with its `resources` in today's names: state an earlier Warren wrote on a node (instance records, snapshot
 * metadata) says `memoryMiB` and `diskMiB` for the same mebibytes.
 */
export function withCurrentResourceNames<T>(value: T): T {
  const resources = (value as { resources?: Record<string, unknown> } | undefined)?.resources;
  if (!resources || typeof resources !== "object" || !("memoryMiB" in resources || "diskMiB" in resources)) {
    return value;
  }
  const { memoryMiB, diskMiB, ...rest } = resources;
  return {
    ...value,
    resources: { ...rest, memoryMB: rest.memoryMB ?? memoryMiB, diskSizeMB: rest.diskSizeMB ?? diskMiB },
  };
}

/** A template as the driver needs it: a read-only root filesystem and how to start envd in it. */
export interface TemplateImage {
  readonly templateId: string;
  /** Content hash of the build; instances record it so a rebuilt template never mixes with old instances. */
  readonly hash: string;
  /** Read-only root filesystem (uids shifted into the sandbox user-namespace range). */
  readonly rootfs: string;
  /** Keep no-new-privileges off so `sudo` works (the E2B templates' `user` has passwordless sudo). */
  readonly allowSetuid: boolean;
  /** Also start the code gateway (port 49999) next to envd; the instance is ready only when both answer. */
  readonly codeGateway?: boolean;
}

export interface InstanceSpec {
  readonly template: TemplateImage;
  readonly resources: SandboxResources;
  readonly labels?: Readonly<Record<string, string>>;
  /** Replace the sandbox's start command (tests of failing starts; ready checks of odd templates). */
  readonly command?: readonly string[];
  /** Egress policy from the start (default: nothing leaves); `setEgress` changes it later. */
  readonly egress?: EgressPolicy;
  /**
   * Start from this snapshot (`RuntimeDriver.snapshot`) instead of the template's pristine root: its files, and
   * its processes and memory when the snapshot has them (then the instance continues where the source was; the
   * agent's /init gives it its own identity). `template` must be the snapshot's template (same hash) and
   * `resources` the snapshot's for a memory snapshot.
   */
  readonly snapshotId?: string;
  /**
   * Host folders bound read-write into the sandbox (team volumes), with ids on disk as seen inside (an idmapped
   * mount): every sandbox that binds one sees the same owners. Drivers that cannot refuse the create.
   */
  readonly volumes?: readonly { readonly source: string; readonly destination: string }[];
  /**
   * Start in the node's background CPU class (a warm pool's refill): the start yields the CPU to the node's other
   * sandboxes and takes at most a share of it from the node's own processes; `foreground` ends it when the instance
   * is claimed. Drivers without such a class start it normally.
   */
  readonly background?: boolean;
  /**
   * A `background` start that a create came to wait for (a warm pool's refill, WarmPool.next): asked as the start
   * goes, and once true it goes on as a create's start would (normal CPU class, envd's warm-up after /init).
   */
  readonly promoted?: () => boolean;
  /**
   * Told the new instance's id once it exists and has its CPU class, before its processes start: a warm pool's
   * background start that a create comes to wait for later is then made foreground (`foreground`).
   */
  readonly onInstance?: (instanceId: string) => void;
}

export interface Instance {
  readonly instanceId: string;
  readonly templateId: string;
  readonly templateHash: string;
  /** IP address of the sandbox, reachable from the node; any port a sandbox process listens on is reachable here. */
  readonly addr: string;
  readonly envdUrl: string;
  readonly resources: SandboxResources;
  readonly createdAt: number;
  readonly labels: Readonly<Record<string, string>>;
  readonly paused: boolean;
  /** Paused and checkpointed to disk (no process left, memory released); false for the freezer tier. */
  readonly checkpointed: boolean;
  /** Paused with every process ended (filesystem-only pause): the next start is a reboot. */
  readonly stopped: boolean;
}

/**
 * The node has no room for this instance (its disk, say), though another node may: the node agent answers
 * `resource_exhausted`, so the master places the sandbox elsewhere.
 */
export class CapacityExceeded extends Error {
  /** `diskShortMB`: how much more disk (MiB) the node would need to promise to take the instance, when known. */
  constructor(
    message: string,
    readonly diskShortMB?: number,
  ) {
    super(message);
    this.name = "CapacityExceeded";
  }
}

/** A process the kernel killed at a sandbox's memory limit. */
export interface OomKill {
  /** Its name (the kernel's `comm`, at most 15 characters). */
  readonly process: string;
  /** Its anonymous and shared memory when killed. */
  readonly memoryBytes: number;
  /** When (ISO 8601). */
  readonly at: string;
}

export interface InstanceStats {
  /** Processes the kernel killed at the sandbox's memory limit since it started (0 where the driver cannot tell). */
  readonly oomKills?: number;
  /** The latest of those kills by name, where the driver can tell (the kernel's log), oldest first. */
  readonly oomVictims?: readonly OomKill[];
  readonly memoryUsageBytes: number;
  readonly memoryLimitBytes: number;
  readonly cpuUsageUsec: number;
  readonly pids: number;
  readonly pidsLimit: number;
  readonly diskUsageBytes: number;
  readonly diskLimitBytes: number;
}

export interface CheckpointResult {
  /** Size of the checkpoint images. */
  readonly imageBytes: number;
  /** Memory the sandbox's cgroup was charged before and after (the writable layer's tmpfs stays charged). */
  readonly memoryBeforeBytes: number;
  readonly memoryAfterBytes: number;
}

/** A snapshot of an instance, kept by the driver on the node until `deleteSnapshot`. */
export interface SnapshotImage {
  readonly snapshotId: string;
  /** The driver that made it (`namespace`, `microvm`): only that driver can start instances from it. */
  readonly driver: string;
  readonly templateId: string;
  readonly templateHash: string;
  /**
   * Processes and memory are in it: an instance created from it continues them (same pids, in-memory state).
   * False: files only; an instance created from it boots fresh over them.
   */
  readonly memory: boolean;
  /** The source's resources (a memory snapshot can only start with these). */
  readonly resources: SandboxResources;
  /** Bytes on the node's disk. */
  readonly sizeBytes: number;
  readonly createdAt: number;
}

/**
 * A driver's snapshot layers: immutable, named once for all (a name is its content), shared by every snapshot
 * that stacks them. A snapshot of a sandbox made from a template stacks the template's layers, so moving it, or
 * publishing it to the store, moves only the sandbox's own.
 */
export interface SnapshotLayers {
  /** The snapshot's layer names, topmost first; undefined for an unknown snapshot. */
  layersOf(snapshotId: string): Promise<readonly string[] | undefined>;
  /** Every layer on this node. */
  localLayers(): Promise<readonly string[]>;
  /** One layer as a byte stream, which `importSnapshot` reads after an export that left it out. */
  exportLayer(name: string): AsyncIterable<Uint8Array>;
}

export interface SnapshotOptions {
  /**
   * Files only, even where the driver keeps memory (a template build's step layers: a sandbox started from one
   * boots fresh over its files). Drivers whose snapshots always hold memory (microvm) ignore it.
   */
  readonly filesOnly?: boolean;
}

export interface ResumeResult {
  readonly tier: "freezer" | "checkpoint";
}

export interface ReconcileResult {
  /** Instances found alive and healthy: the driver manages them again. */
  readonly adopted: readonly Instance[];
  /** Instances found dead or broken and removed, with the labels they had (the agent deletes their routes). */
  readonly removed: readonly { readonly instanceId: string; readonly labels: Readonly<Record<string, string>> }[];
}

export interface RuntimeDriver {
  readonly name: string;
  /** Binds team volumes into its sandboxes (`InstanceSpec.volumes`); absent: creates with volumes are refused. */
  readonly mountsVolumes?: boolean;
  /**
   * How long envd's first call (/init) of a just-started or rebooted instance may take: a guest's first request
   * is slow where a guest is emulated (a TCG microVM on a loaded host needed more than 5 s here).
   */
  readonly envdInitTimeoutMs: number;
  /** Host preparation (firewall chains, cgroup parents, network pool); idempotent. */
  start(): Promise<void>;
  /** Starts an instance; resolves once envd answers /health. On failure nothing is left behind. */
  create(spec: InstanceSpec): Promise<Instance>;
  /** Merges labels into the instance's on-disk record. */
  label(instanceId: string, labels: Readonly<Record<string, string>>): Promise<Instance>;
  /** Gives an instance started `background` (InstanceSpec) its normal CPU weight and quota; idempotent. */
  foreground?(instanceId: string): Promise<void>;
  /**
   * Stops every process and removes every trace (mounts, cgroups, netns, veth, firewall rules, files). With
   * `reclaimLater` (a user's kill, where only "stopped" is waited for), resolves once every process is gone and the
   * instance is forgotten; its host resources are removed in the background (`settled()` waits for that).
   */
  kill(instanceId: string, options?: { readonly reclaimLater?: boolean }): Promise<void>;
  /** Resolves once every background reclaim started by `kill` has ended. */
  settled?(): Promise<void>;
  /** Freezes the instance's processes (instant tier; memory stays resident). */
  pause(instanceId: string): Promise<void>;
  /** Whether `checkpoint` is available (the namespace driver needs CRIU 4). */
  readonly canCheckpoint: boolean;
  /**
   * Converts a paused instance into a checkpoint on disk (the deep tier): its processes end and their memory is
   * released; the writable layer, network and cgroups stay. On failure the instance stays frozen.
   */
  checkpoint(instanceId: string): Promise<CheckpointResult>;
  /** Thaws a frozen instance, or restores a checkpointed one (same pids in the sandbox, same address). */
  resume(instanceId: string): Promise<ResumeResult>;
  /** Filesystem-only pause: ends every process of a paused instance, keeping its disk, network and cgroups. */
  stop(instanceId: string): Promise<void>;
  /** Starts a paused or stopped instance afresh over its kept disk (new boot id); resolves once envd answers. */
  reboot(instanceId: string): Promise<Instance>;
  list(): Instance[];
  /** Whether `snapshot` keeps processes and memory (otherwise snapshots hold files only). */
  readonly snapshotsKeepMemory: boolean;
  /**
   * Captures a running or paused instance as snapshot `snapshotId`: its writable disk, and its memory when
   * `snapshotsKeepMemory` and it has processes (a filesystem-only paused instance has none). A running instance is
   * paused for the copy and runs on after it (same pids); a paused one stays paused. Instances created from the
   * snapshot never depend on it being kept (deleteSnapshot may run while they live). On failure nothing of the
   * snapshot is left and the instance is as it was.
   */
  snapshot(instanceId: string, snapshotId: string, options?: SnapshotOptions): Promise<SnapshotImage>;
  /**
   * The files a sandbox from the snapshot (files only, over `template`) would see, as one plain root filesystem at
   * `dest` (which must not exist): a template the template builder made, become a node template. Drivers without
   * it cannot take shipped templates from the builder.
   */
  flattenSnapshot?(snapshotId: string, template: TemplateImage, dest: string): Promise<void>;
  /**
   * Makes a files-only snapshot whose only layer is a copy of `dir` over `template`'s root (an OCI image's
   * prepared rootfs over the empty `scratch` template): how templates built from images start. Drivers without it
   * cannot build from images.
   */
  snapshotFromDirectory?(
    snapshotId: string,
    template: TemplateImage,
    dir: string,
    resources: SandboxResources,
  ): Promise<SnapshotImage>;
  /** Removes a snapshot's files; unknown ids are ignored (idempotent). */
  deleteSnapshot(snapshotId: string): Promise<void>;
  /** Every snapshot this driver keeps (after an agent restart, too). */
  listSnapshots(): Promise<SnapshotImage[]>;
  /**
   * The snapshot as one byte stream (a tar of everything it needs), for `importSnapshot` on another node with the
   * same driver: how a paused sandbox moves between nodes. Drivers without it keep sandboxes where they are. With
   * `snapshotLayers`, the layers named in `omitLayers` are left out (the receiver has them).
   */
  exportSnapshot?(snapshotId: string, omitLayers?: ReadonlySet<string>): AsyncIterable<Uint8Array>;
  /**
   * Stores a stream `exportSnapshot` made (on another node) as snapshot `snapshotId`; on failure nothing is left.
   * With `snapshotLayers`, the stream may leave out layers this node has and be followed by `exportLayer` streams.
   */
  importSnapshot?(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage>;
  /** Drivers whose snapshots stack shared, immutable layers: transfers move only the layers the other side lacks. */
  readonly snapshotLayers?: SnapshotLayers;
  /**
   * Replaces the instance's egress policy while it runs (or is paused); kept with the instance and restored after
   * an agent restart. Drivers without it keep every sandbox's egress closed (the agent refuses other policies).
   */
  setEgress?(instanceId: string, policy: EgressPolicy): Promise<void>;
  /** The last `maxBytes` of what the instance's PID 1 and envd printed (whole lines), for the sandbox logs API. */
  logTail?(instanceId: string, maxBytes: number): Promise<string>;
  stats(instanceId: string): Promise<InstanceStats>;
  /**
   * Why a running (not paused) instance is dead — its PID 1 exited, taking envd with it — or undefined while it
   * lives. Drivers without it are not watched.
   */
  deathOf?(instanceId: string): Promise<string | undefined>;
  /** After an agent restart: re-adopt live instances from disk, remove dead ones and any orphan. */
  reconcile(): Promise<ReconcileResult>;
  /** Stops background work; instances keep running (a restarted agent re-adopts them). */
  close(): Promise<void>;
}
