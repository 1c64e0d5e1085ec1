import { spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, open, readdir, readFile, rename, rm, statfs, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../../node-agent/log.js";
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
} from "../driver.js";
import { type EgressGateway, nodeEgressGateway } from "../egress/gateway.js";
import { CLOSED_EGRESS, compileEgress, type EgressPolicy } from "../egress/policy.js";
import { exec } from "../exec.js";
import { DEFAULT_LOG_CAP, LogCap, type LogCapLimits } from "../log-cap.js";
import { CODE_GATEWAY_PORT, ENVD_PORT, healthy, processStartTime } from "../sandbox-process.js";
import { type CgroupManager, detectCgroupManager } from "./cgroups.js";
import { criuDump, criuRestore, directorySize, externalFileKey } from "./criu.js";
import { probeCriu } from "./criu-probe.js";
import { type GatewayPorts, sandboxFirewallRules } from "./egress-rules.js";
import { LayerStore, type MemoryImage } from "./layer-store.js";
import { mountPoints, unmountTree } from "./mounts.js";
import { NetworkPool, type NetworkSlot } from "./network.js";
import { sandboxSpec } from "./oci-spec.js";

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
 * Disk quota: the writable layer is a size-limited tmpfs (upper + work dirs of the overlay). Its pages are
 * charged to the sandbox's memory cgroup, so disk use also counts against the memory limit.
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
  /** The host's node binary, bind-mounted read-only at /usr/local/bin/node (one copy of its pages per host). */
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
}

/**
 * PID 1's child in code templates (`tini -g -- sh -c SANDBOX_INIT sandbox-init <envd command>`): starts the code
 * gateway in its own session (`setsid -f`: re-parented to tini, which reaps it; tini's signals to envd's process
 * group do not reach it; no parent-death signal), restarted if it exits, then becomes envd. The gateway's settings
 * go to its environment only, so envd and the processes it starts never see them. Kernels get their own sessions
 * from the gateway (setpriv --pdeathsig KILL: they never outlive it). The runtime directory is the gateway's
 * default, /tmp/warren-cg-<pid> (a restarted gateway removes the dead one's).
 */
const SANDBOX_INIT = `env CODE_GATEWAY_HOST=0.0.0.0 CODE_GATEWAY_PORT=${CODE_GATEWAY_PORT} \
  CODE_GATEWAY_ENVD_URL=http://127.0.0.1:${ENVD_PORT} CODE_GATEWAY_AUTH=envd \
  CODE_GATEWAY_NODE=/usr/local/bin/node CODE_GATEWAY_PYTHON=/usr/bin/python3 \
  setsid -f /bin/sh -c 'while :; do /usr/local/bin/node --max-semi-space-size=1 /opt/warren/code-gateway/dist/main.js; sleep 1; done' </dev/null
exec "$@"
`;

const ID_COUNT = 65536;
/** Per-instance files bind-mounted into the sandbox. */
const RESOLV_CONF = "/etc/resolv.conf";
const BOOT_ID = "/proc/sys/kernel/random/boot_id";

interface InstanceRecord {
  instanceId: string;
  templateId: string;
  templateHash: string;
  /** The template's rootfs. */
  lowerDir: string;
  /** Snapshot layers stacked above it, topmost first (an instance made from a snapshot). */
  layers?: string[];
  allowSetuid: boolean;
  /** Runs the code gateway next to envd (ready only when both answer). */
  codeGateway?: boolean;
  slot: number;
  addr: string;
  resources: SandboxResources;
  createdAt: number;
  labels: Record<string, string>;
  /** Egress policy in force (re-applied after an agent restart: the gateway's ports change). */
  egress?: EgressPolicy;
  pid?: number;
  pidStartTime?: string;
  paused: boolean;
  /** Paused with its processes ended (filesystem-only pause): the next start is a reboot. */
  stopped?: boolean;
  /** Set while the instance is checkpointed to `<dir>/checkpoint` (no process runs). */
  checkpoint?: {
    /** CRIU's key of the host file the sandbox's stdout/stderr point to (envd.log), re-attached on restore. */
    readonly logFileKey: string;
  };
}

/** The writable layer (a size-limited tmpfs) and the overlay root over the template (and snapshot layers). */
const MOUNT_ROOT = `set -e
D="$1"
mkdir -p "$D/disk" "$D/rootfs"
mount -t tmpfs -o "size=\${DISK_MIB}m,mode=0755,nodev" warren-disk "$D/disk"
mkdir "$D/disk/upper" "$D/disk/work"
chown "$UID_BASE:$UID_BASE" "$D/disk/upper"
chmod 0755 "$D/disk/upper"
mount -t overlay -o "lowerdir=$LOWER,upperdir=$D/disk/upper,workdir=$D/disk/work" warren-root "$D/rootfs"
`;

const START_CONTAINER = `for f in $CGROUP_PROCS; do echo $$ > "$f"; done
exec crun --root "$CRUN_ROOT" --cgroup-manager=disabled run --detach --bundle "$D/bundle" --pid-file "$D/pid" "$CID"
`;

const LAUNCHER = MOUNT_ROOT + START_CONTAINER;

/** A reboot: the disk and overlay are still mounted; only the container starts again. */
const RELAUNCHER = `set -e
D="$1"
${START_CONTAINER}`;

export class NamespaceDriver implements RuntimeDriver {
  readonly name = "namespace";
  readonly envdInitTimeoutMs = 10_000;
  private readonly instances = new Map<string, InstanceRecord>();
  private readonly cgroups: CgroupManager;
  readonly network: NetworkPool;
  private readonly instancesDir: string;
  private readonly crunRoot: string;
  private readonly gateway: EgressGateway;
  private gatewayPorts: GatewayPorts | undefined;
  /** The configured CRIU, once the start-up probe has seen it dump and restore a process. */
  private criuUsable = false;
  private readonly snapshots: LayerStore;
  /** Keeps each sandbox's envd.log (PID 1's stdout/stderr, writable by the sandbox) under its cap. */
  private readonly logCap: LogCap;

  constructor(private readonly options: NamespaceDriverOptions) {
    this.cgroups = detectCgroupManager(`warren/${options.instance}`);
    this.network = new NetworkPool({
      instance: options.instance,
      cidr: options.netCidr,
      poolSize: options.netPoolSize,
      log: options.log,
      ...(options.uplinkForwarding === false ? { uplinkForwarding: false } : {}),
    });
    this.instancesDir = join(options.stateDir, "instances");
    this.crunRoot = join(options.stateDir, "crun");
    this.snapshots = new LayerStore(options.stateDir, options.log.child({ part: "snapshots" }));
    this.gateway = nodeEgressGateway(options);
    this.logCap = new LogCap(
      () => [...this.instances.keys()].map((id) => join(this.instanceDir(id), "envd.log")),
      options.logCap ?? DEFAULT_LOG_CAP,
      options.log.child({ part: "log-cap" }),
    );
  }

  get cgroupVersion(): 1 | 2 {
    return this.cgroups.version;
  }

  /** The directory of an instance's files and mounts (tests inspect it). */
  instanceDir(instanceId: string): string {
    return join(this.instancesDir, instanceId);
  }

  containerId(instanceId: string): string {
    return `warren-${this.options.instance}-${instanceId}`;
  }

  /** envd's esbuild bundle (one file: fast to load) when built, else its tsc output. */
  private get envdEntry(): string {
    return existsSync(join(this.options.envdRoot, "envd", "dist", "envd.mjs")) ? "envd.mjs" : "main.js";
  }

  async start(): Promise<void> {
    await mkdir(this.instancesDir, { recursive: true });
    await mkdir(this.crunRoot, { recursive: true });
    await this.snapshots.start();
    await this.cgroups.prepare();
    await this.network.start();
    this.gatewayPorts = await this.gateway.start();
    await this.network.allowGateway(this.gatewayPorts);
    if (this.options.criu) {
      const probe = await probeCriu(this.options.criu);
      this.criuUsable = probe.usable;
      if (probe.usable) this.options.log.info("CRIU checkpoint tier available", { reason: probe.reason });
      else
        this.options.log.warn("CRIU does not work on this host: paused sandboxes stay frozen in memory", {
          reason: probe.reason,
        });
    }
    this.logCap.start();
  }

  /** Starts refilling the network pool (after reconcile, so adopted slots are known). */
  startPools(): void {
    this.network.refill();
  }

  async create(spec: InstanceSpec): Promise<Instance> {
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
      record = {
        instanceId,
        templateId: spec.template.templateId,
        templateHash: spec.template.hash,
        lowerDir: spec.template.rootfs,
        ...(base ? { layers: [...base.snapshot.layers] } : {}),
        allowSetuid: spec.template.allowSetuid,
        codeGateway: spec.template.codeGateway === true,
        slot: slot.index,
        addr: slot.sandboxAddr,
        resources: spec.resources,
        createdAt: Date.now(),
        labels: { ...spec.labels },
        egress: spec.egress ?? CLOSED_EGRESS,
        paused: false,
      };
      // The record goes to disk before anything else exists, so a crash at any later step is cleaned up.
      await this.persist(record);
      this.instances.set(instanceId, record);
      const cgroup = await this.cgroups.create(instanceId, spec.resources);
      await this.writeInstanceFiles(record, slot, spec.command);
      await this.applyEgress(record);
      const launchAt = performance.now();
      const memory = base?.snapshot.criu;
      if (memory && spec.snapshotId) {
        // The snapshot's processes continue here: same boot, this instance's root, network and cgroups.
        await writeFile(join(dir, "boot_id"), `${memory.bootId}\n`);
        await this.runLauncher(record, cgroup.procsFiles, MOUNT_ROOT);
        await this.restoreFrom(record, this.snapshots.memoryDir(spec.snapshotId), memory.logFileKey);
      } else {
        await this.launch(record, cgroup.procsFiles);
      }
      const readyAt = performance.now();
      if (!memory) await this.waitReady(record, log);
      log.debug("instance ready", {
        addr: record.addr,
        launchMs: Math.round(readyAt - launchAt),
        envdStartMs: Math.round(performance.now() - readyAt),
      });
      return this.toInstance(record);
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
   * The writable layer is copied while the sandbox is frozen, then (where CRIU works and it has processes) its
   * processes are dumped from that same frozen moment, left in place: a running sandbox thaws right after (same
   * processes), a paused one stays paused, a checkpointed one lends its checkpoint.
   */
  async snapshot(instanceId: string, snapshotId: string): Promise<SnapshotImage> {
    const record = this.require(instanceId);
    const cgroup = this.cgroups.open(instanceId);
    const freeze = !record.paused;
    if (freeze) await cgroup.freeze();
    const withMemory = this.canCheckpoint && !record.stopped && (record.checkpoint || record.pid !== undefined);
    try {
      const {
        layers: _layers,
        criu: _criu,
        ...image
      } = await this.snapshots.capture(
        snapshotId,
        {
          templateId: record.templateId,
          templateHash: record.templateHash,
          resources: record.resources,
          upperDir: join(this.instanceDir(instanceId), "disk", "upper"),
          layers: record.layers ?? [],
        },
        withMemory ? (imagesDir) => this.dumpForSnapshot(record, imagesDir) : undefined,
      );
      return image;
    } finally {
      // Frozen again whatever CRIU did to the freezer (a paused sandbox stays paused), then thawed if it ran.
      if (withMemory && !record.checkpoint) await cgroup.freeze().catch(() => undefined);
      if (freeze) await cgroup.thaw();
    }
  }

  private async dumpForSnapshot(record: InstanceRecord, imagesDir: string): Promise<MemoryImage> {
    const dir = this.instanceDir(record.instanceId);
    const bootId = (await readFile(join(dir, "boot_id"), "utf8")).trim();
    if (record.checkpoint) {
      await exec("cp", ["-a", "--", join(dir, "checkpoint"), imagesDir]);
      return { logFileKey: record.checkpoint.logFileKey, bootId };
    }
    const criu = this.options.criu;
    if (!criu || record.pid === undefined) throw new Error(`instance '${record.instanceId}' has no processes to dump`);
    const logFileKey = await externalFileKey(record.pid, join(dir, "envd.log"));
    await criuDump({
      criu,
      netnsPath: this.network.slot(record.slot).netnsPath,
      pid: record.pid,
      imagesDir,
      freezerDir: this.cgroups.open(record.instanceId).freezerDir,
      logFileKey,
      leaveRunning: true,
    });
    return { logFileKey, bootId };
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.snapshots.delete(snapshotId);
    await this.collectLayers();
  }

  async listSnapshots(): Promise<SnapshotImage[]> {
    return (await this.snapshots.list()).map(({ layers: _layers, ...image }) => image);
  }

  exportSnapshot(snapshotId: string): AsyncIterable<Uint8Array> {
    return this.snapshots.export(snapshotId);
  }

  async importSnapshot(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    const { layers: _layers, ...image } = await this.snapshots.import(snapshotId, data);
    return image;
  }

  private async collectLayers(): Promise<void> {
    await this.snapshots
      .collect(() => [...this.instances.values()].flatMap((r) => r.layers ?? []))
      .catch((error) => this.options.log.error("removing unused snapshot layers failed", { error }));
  }

  /** The bundle (OCI config), boot id and resolv.conf of an instance: what crun and its bind mounts need. */
  private async writeInstanceFiles(
    record: InstanceRecord,
    slot: NetworkSlot,
    command: readonly string[] | undefined,
  ): Promise<void> {
    const dir = this.instanceDir(record.instanceId);
    const maxOldSpace = Math.max(32, Math.floor(record.resources.memoryMiB / 2));
    const envd = [
      "/usr/local/bin/node",
      `--max-old-space-size=${maxOldSpace}`,
      // envd's own measurement: a 1 MiB semi-space cuts idle PSS by about a third.
      "--max-semi-space-size=1",
      `/opt/warren/envd/dist/${this.envdEntry}`,
      "--host",
      "0.0.0.0",
      "--port",
      String(ENVD_PORT),
      "--default-user",
      "user",
      // Ports sandbox processes listen on at loopback only are reachable through the proxy, as on E2B.
      "--expose-loopback",
    ];
    const init = record.codeGateway ? ["/bin/sh", "-c", SANDBOX_INIT, "sandbox-init"] : [];
    const args = command ?? ["/usr/bin/tini", "-g", "--", ...init, ...envd];
    const config = sandboxSpec({
      rootfs: join(dir, "rootfs"),
      netnsPath: slot.netnsPath,
      uidBase: this.options.uidBase,
      idCount: ID_COUNT,
      allowSetuid: record.allowSetuid,
      args,
      env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"],
      hostBinds: [
        { source: this.options.nodeBinary, destination: "/usr/local/bin/node" },
        { source: join(this.options.envdRoot, "envd"), destination: "/opt/warren/envd" },
        { source: join(this.options.envdRoot, "proto"), destination: "/opt/warren/proto" },
        { source: join(this.options.envdRoot, "node_modules"), destination: "/opt/warren/node_modules" },
        // The gateway's imports (zeromq, sucrase, acorn) resolve from /opt/warren/node_modules above.
        ...(record.codeGateway
          ? ["dist", "python", "package.json"].map((name) => ({
              source: join(this.options.envdRoot, "code-gateway", name),
              destination: `/opt/warren/code-gateway/${name}`,
            }))
          : []),
        { source: join(dir, "resolv.conf"), destination: RESOLV_CONF },
        // Per boot, as in a VM: a reboot (resume after a filesystem-only pause) writes a new one.
        { source: join(dir, "boot_id"), destination: BOOT_ID },
      ],
    });
    await writeFile(join(dir, "boot_id"), `${randomUUID()}\n`);
    // DNS goes to the node's egress gateway at the host side of the veth (its rules redirect any port-53 UDP).
    await writeFile(join(dir, "resolv.conf"), `nameserver ${slot.hostAddr}\noptions timeout:2 attempts:2\n`);
    await writeFile(join(dir, "bundle", "config.json"), JSON.stringify(config));
  }

  private async launch(record: InstanceRecord, procsFiles: readonly string[], script = LAUNCHER): Promise<void> {
    await this.runLauncher(record, procsFiles, script);
    const pid = Number((await readFile(join(this.instanceDir(record.instanceId), "pid"), "utf8")).trim());
    record.pid = pid;
    record.pidStartTime = await processStartTime(pid);
    await this.persist(record);
  }

  private async runLauncher(record: InstanceRecord, procsFiles: readonly string[], script: string): Promise<void> {
    const dir = this.instanceDir(record.instanceId);
    const logFile = await open(join(dir, "envd.log"), "a");
    try {
      const code = await new Promise<number>((resolve, reject) => {
        const child = spawn("sh", ["-c", script, "launcher", dir], {
          env: {
            PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            DISK_MIB: String(record.resources.diskMiB),
            UID_BASE: String(this.options.uidBase),
            LOWER: [...(record.layers ?? []), record.lowerDir].join(":"),
            CGROUP_PROCS: procsFiles.join(" "),
            CRUN_ROOT: this.crunRoot,
            CID: this.containerId(record.instanceId),
          },
          stdio: ["ignore", logFile.fd, logFile.fd],
        });
        child.once("error", reject);
        child.once("exit", (exitCode) => resolve(exitCode ?? 1));
      });
      if (code !== 0) {
        const tail = (await readFile(join(dir, "envd.log"), "utf8").catch(() => "")).slice(-500);
        throw new Error(`sandbox launcher failed (${code}): ${tail.trim()}`);
      }
    } finally {
      await logFile.close();
    }
  }

  private async waitReady(record: InstanceRecord, log: Logger): Promise<void> {
    const deadline = Date.now() + this.options.readyTimeoutMs;
    let envdUp = false;
    for (let attempt = 0; ; attempt++) {
      envdUp ||= await healthy(record.addr, 250);
      if (envdUp && (!record.codeGateway || (await healthy(record.addr, 250, CODE_GATEWAY_PORT)))) return;
      if (!record.pid || (await processStartTime(record.pid)) !== record.pidStartTime) {
        const tail = (await readFile(join(this.instanceDir(record.instanceId), "envd.log"), "utf8").catch(() => ""))
          .slice(-500)
          .trim();
        throw new Error(`sandbox exited before ${envdUp ? "the code gateway" : "envd"} answered: ${tail}`);
      }
      if (Date.now() > deadline) {
        throw new Error(
          `${envdUp ? "the code gateway" : "envd"} did not answer within ${this.options.readyTimeoutMs} ms`,
        );
      }
      if (attempt % 500 === 499) log.debug("still waiting for envd", { attempt });
      await new Promise((resolve) => setTimeout(resolve, attempt < 100 ? 2 : 10));
    }
  }

  async label(instanceId: string, labels: Readonly<Record<string, string>>): Promise<Instance> {
    const record = this.require(instanceId);
    record.labels = { ...record.labels, ...labels };
    await this.persist(record);
    return this.toInstance(record);
  }

  async kill(instanceId: string): Promise<void> {
    const record = this.require(instanceId);
    await this.teardown(record);
  }

  async pause(instanceId: string): Promise<void> {
    const record = this.require(instanceId);
    await this.cgroups.open(instanceId).freeze();
    record.paused = true;
    await this.persist(record);
  }

  get canCheckpoint(): boolean {
    return this.options.criu !== undefined && this.criuUsable;
  }

  /** Memory goes into snapshots where CRIU works (the same dump as a checkpoint, leaving the sandbox running). */
  get snapshotsKeepMemory(): boolean {
    return this.canCheckpoint;
  }

  /** CRIU dump of a frozen sandbox (criu.ts): its processes end, their memory is released. */
  async checkpoint(instanceId: string): Promise<CheckpointResult> {
    const record = this.require(instanceId);
    const criu = this.options.criu;
    if (!criu || !this.criuUsable) throw new Error("no working CRIU on this node");
    if (!record.paused || record.checkpoint || record.pid === undefined) {
      throw new Error(`instance '${instanceId}' is not frozen`);
    }
    const dir = this.instanceDir(instanceId);
    const images = join(dir, "checkpoint");
    const cgroup = this.cgroups.open(instanceId);
    const memoryBeforeBytes = (await cgroup.usage()).memoryBytes;
    const logFileKey = await externalFileKey(record.pid, join(dir, "envd.log"));
    try {
      await criuDump({
        criu,
        netnsPath: this.network.slot(record.slot).netnsPath,
        pid: record.pid,
        imagesDir: images,
        freezerDir: cgroup.freezerDir,
        logFileKey,
      });
    } catch (error) {
      // A failed dump leaves the tree running or frozen: make it frozen again, as the caller expects.
      await cgroup.freeze().catch(() => undefined);
      throw error;
    }
    record.checkpoint = { logFileKey };
    await this.persist(record);
    return {
      imageBytes: await directorySize(images),
      memoryBeforeBytes,
      memoryAfterBytes: (await cgroup.usage()).memoryBytes,
    };
  }

  /**
   * Filesystem-only pause: ends every process (their memory is released at once) and drops a checkpoint if there
   * is one; the writable layer, network and cgroups stay for `reboot`.
   */
  async stop(instanceId: string): Promise<void> {
    const record = this.require(instanceId);
    await this.cgroups.open(instanceId).killAll();
    await exec("crun", ["--root", this.crunRoot, "delete", "-f", this.containerId(instanceId)], { allowFailure: true });
    await rm(join(this.instanceDir(instanceId), "checkpoint"), { recursive: true, force: true });
    record.checkpoint = undefined;
    record.stopped = true;
    record.paused = true;
    await this.persist(record);
  }

  /** Starts a paused instance afresh over its kept filesystem: processes are lost, the boot id is new. */
  async reboot(instanceId: string): Promise<Instance> {
    const record = this.require(instanceId);
    // Also after a failed reboot: whatever it left (processes, crun state) goes first.
    await this.stop(instanceId);
    const dir = this.instanceDir(instanceId);
    await writeFile(join(dir, "boot_id"), `${randomUUID()}\n`);
    await this.launch(record, this.cgroups.open(instanceId).procsFiles, RELAUNCHER);
    await this.waitReady(record, this.options.log.child({ instanceId }));
    record.stopped = false;
    record.paused = false;
    await this.persist(record);
    return this.toInstance(record);
  }

  async resume(instanceId: string): Promise<ResumeResult> {
    const record = this.require(instanceId);
    if (record.stopped) throw new Error(`instance '${instanceId}' was stopped (filesystem-only pause): reboot it`);
    if (record.checkpoint) {
      await this.restore(record);
      record.paused = false;
      await this.persist(record);
      return { tier: "checkpoint" };
    }
    await this.cgroups.open(instanceId).thaw();
    record.paused = false;
    await this.persist(record);
    return { tier: "freezer" };
  }

  /** Restores the instance's own checkpoint (same pids, same address). On failure the images stay: still paused. */
  private async restore(record: InstanceRecord): Promise<void> {
    if (!record.checkpoint) throw new Error("no checkpoint to restore");
    const images = join(this.instanceDir(record.instanceId), "checkpoint");
    await this.restoreFrom(record, images, record.checkpoint.logFileKey);
    record.checkpoint = undefined;
    await this.persist(record);
    await rm(images, { recursive: true, force: true });
  }

  /**
   * CRIU restore of `images` into this instance (criu.ts): its cgroups, network and mounted root; its own
   * resolv.conf and boot id. Ready when envd (and the gateway) answer; a tree that does not is ended again.
   */
  private async restoreFrom(record: InstanceRecord, images: string, logFileKey: string): Promise<void> {
    const criu = this.options.criu;
    if (!criu || !this.criuUsable) throw new Error("no working CRIU on this node");
    const dir = this.instanceDir(record.instanceId);
    const pid = await criuRestore({
      criu,
      netnsPath: this.network.slot(record.slot).netnsPath,
      procsFiles: this.cgroups.open(record.instanceId).procsFiles,
      imagesDir: images,
      workDir: join(dir, "criu"),
      rootfs: join(dir, "rootfs"),
      logPath: join(dir, "envd.log"),
      logFileKey,
      uid: this.options.uidBase,
      instanceFiles: { [RESOLV_CONF]: join(dir, "resolv.conf"), [BOOT_ID]: join(dir, "boot_id") },
    });
    record.pid = pid;
    record.pidStartTime = await processStartTime(pid);
    try {
      await this.waitReady(record, this.options.log.child({ instanceId: record.instanceId }));
    } catch (error) {
      await this.cgroups.open(record.instanceId).killAll();
      await this.persist(record);
      throw error;
    }
    await this.persist(record);
  }

  list(): Instance[] {
    return [...this.instances.values()].filter((r) => r.pid !== undefined).map((r) => this.toInstance(r));
  }

  async stats(instanceId: string): Promise<InstanceStats> {
    this.require(instanceId);
    const usage = await this.cgroups.open(instanceId).usage();
    const fs = await statfs(join(this.instanceDir(instanceId), "disk"));
    return {
      memoryUsageBytes: usage.memoryBytes,
      memoryLimitBytes: usage.memoryLimitBytes,
      cpuUsageUsec: usage.cpuUsec,
      pids: usage.pids,
      pidsLimit: usage.pidsLimit,
      diskUsageBytes: (fs.blocks - fs.bfree) * fs.bsize,
      diskLimitBytes: fs.blocks * fs.bsize,
    };
  }

  async reconcile(): Promise<ReconcileResult> {
    const adopted: Instance[] = [];
    const removed: { instanceId: string; labels: Record<string, string> }[] = [];
    const names = existsSync(this.instancesDir) ? await readdir(this.instancesDir) : [];
    const mounts = new Set(await mountPoints());
    for (const name of names) {
      const record = await this.load(name);
      if (!record) {
        await unmountTree(this.instanceDir(name));
        await rm(this.instanceDir(name), { recursive: true, force: true });
        continue;
      }
      const alive =
        record.pid !== undefined &&
        (await processStartTime(record.pid)) === record.pidStartTime &&
        mounts.has(join(this.instanceDir(name), "rootfs")) &&
        existsSync(this.network.slot(record.slot).netnsPath) &&
        (record.paused || (await healthy(record.addr, 1000)));
      // A checkpointed instance has no process: it is alive when its images, root and network are there.
      const stopped =
        record.stopped === true &&
        mounts.has(join(this.instanceDir(name), "rootfs")) &&
        existsSync(this.network.slot(record.slot).netnsPath);
      const checkpointed =
        record.checkpoint !== undefined &&
        existsSync(join(this.instanceDir(name), "checkpoint", "inventory.img")) &&
        mounts.has(join(this.instanceDir(name), "rootfs")) &&
        existsSync(this.network.slot(record.slot).netnsPath);
      if (alive || checkpointed || stopped) {
        this.instances.set(name, record);
        // The gateway listens on new ports after a restart: rewrite the sandbox's rules to match.
        await this.applyEgress(record).catch((error) =>
          this.options.log.error("restoring an adopted sandbox's egress policy failed", { instanceId: name, error }),
        );
        adopted.push(this.toInstance(record));
      } else {
        this.options.log.warn("removing dead sandbox instance found at start", { instanceId: name });
        await this.teardown(record);
        removed.push({ instanceId: name, labels: record.labels });
      }
    }
    // Orphans with no record at all: cgroups, crun state, mounts, network slots.
    for (const name of await this.cgroups.listNames()) {
      if (this.instances.has(name)) continue;
      const cgroup = this.cgroups.open(name);
      await cgroup.killAll().catch(() => undefined);
      await cgroup.remove().catch((error) => this.options.log.error("orphan cgroup removal failed", { name, error }));
    }
    const crunList = await exec("crun", ["--root", this.crunRoot, "list", "-q"], { allowFailure: true });
    for (const cid of crunList.stdout.split("\n").filter(Boolean)) {
      const instanceId = cid.slice(this.containerId("").length);
      if (!this.instances.has(instanceId))
        await exec("crun", ["--root", this.crunRoot, "delete", "-f", cid], { allowFailure: true });
    }
    for (const point of await mountPoints()) {
      if (!point.startsWith(`${this.instancesDir}/`)) continue;
      const instanceId = point.slice(this.instancesDir.length + 1).split("/")[0] ?? "";
      if (!this.instances.has(instanceId)) await unmountTree(this.instanceDir(instanceId));
    }
    await this.network.sweep(new Set([...this.instances.values()].map((r) => r.slot)));
    await this.collectLayers();
    return { adopted, removed };
  }

  async close(): Promise<void> {
    this.logCap.close();
    await this.network.close();
    await this.network.removeGatewayRules();
    await this.gateway.close();
  }

  /** Replaces the instance's egress policy: its namespace's firewall and the gateway's view, atomically each. */
  async setEgress(instanceId: string, policy: EgressPolicy): Promise<void> {
    const record = this.require(instanceId);
    const before = record.egress ?? CLOSED_EGRESS;
    if (compileEgress(before).key === compileEgress(policy).key) return;
    record.egress = policy;
    try {
      await this.applyEgress(record);
    } catch (error) {
      record.egress = before;
      await this.applyEgress(record).catch(() => undefined);
      throw error;
    }
    await this.persist(record);
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

  private async applyEgress(record: InstanceRecord): Promise<void> {
    const policy = compileEgress(record.egress ?? CLOSED_EGRESS);
    const slot = this.network.slot(record.slot);
    await this.network.applySandboxFirewall(
      slot,
      sandboxFirewallRules(policy, slot.hostAddr, this.network.cidr, this.gatewayPorts),
    );
    this.gateway.setPolicy(record.addr, policy);
  }

  /** Removes everything an instance has, in an order that works from any partial state. */
  private async teardown(record: InstanceRecord): Promise<void> {
    const dir = this.instanceDir(record.instanceId);
    const cgroup = this.cgroups.open(record.instanceId);
    await cgroup.killAll();
    await exec("crun", ["--root", this.crunRoot, "delete", "-f", this.containerId(record.instanceId)], {
      allowFailure: true,
    });
    await unmountTree(dir);
    await cgroup.remove();
    this.gateway.removePolicy(record.addr);
    await this.network.release(this.network.slot(record.slot));
    this.instances.delete(record.instanceId);
    await rm(dir, { recursive: true, force: true });
    if (record.layers?.length) await this.collectLayers();
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
      checkpointed: record.checkpoint !== undefined,
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
