import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { lstat, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { envdLauncherPath, exec } from "../exec.js";
import { CODE_GATEWAY_PORT, ENVD_PORT, healthy, processStartTime } from "../sandbox-process.js";
import type { SandboxCgroup } from "./cgroups.js";
import type { InstanceRecord, InstanceRecords } from "./instance-records.js";
import { LogChanges } from "./log-changes.js";
import type { NetworkSlot } from "./network.js";
import { sandboxSpec } from "./oci-spec.js";
import { type DiskLaunch, MAKE_DISK, MAKE_LAYER_DIRS, type SandboxDisks } from "./sandbox-disks.js";

/**
 * The descriptor of the sandbox's workload cgroup (cgroups.ts) in PID 1 and what inherits it (envd, the code
 * gateway): the launcher opens its `cgroup.procs` as host root and crun passes it on (--preserve-fds). A write to a
 * cgroup v1 file is checked against the credentials it was opened with, so envd can move its commands there after
 * they dropped to `user`; the sandbox never sees the node's cgroup tree.
 */
export const WORKLOAD_FD = 3;
/** The workload's OOM kill count, open for reading, for envd to tell an OOM kill from another SIGKILL. */
export const WORKLOAD_OOM_FD = 4;

/**
 * PID 1's child in code templates (`tini -g -- sh -c SANDBOX_INIT sandbox-init <envd command>`): starts the code
 * gateway in its own session (`setsid -f`: re-parented to tini, which reaps it; tini's signals to envd's process
 * group do not reach it; no parent-death signal), restarted if it exits, then becomes envd. The gateway's settings
 * go to its environment only, so envd and the processes it starts never see them. Kernels get their own sessions
 * from the gateway (setpriv --pdeathsig KILL: they never outlive it). The runtime directory is the gateway's
 * default, /tmp/warren-cg-<pid> (a restarted gateway removes the dead one's).
 */
/**
 * Where envd and the code gateway find the host's node: a path of Warren's own, so an image's own
 * /usr/local/bin/node (a `node:22` image's) stays the sandbox's `node`.
 */
export const ENVD_NODE = "/opt/warren/bin/node";
/** The sandbox's `node` in templates without one of their own (an empty placeholder there): the host's too. */
const USER_NODE = "/usr/local/bin/node";

const sandboxInit = (processLimit: number) => `env CODE_GATEWAY_HOST=0.0.0.0 CODE_GATEWAY_PORT=${CODE_GATEWAY_PORT} \
  CODE_GATEWAY_ENVD_URL=http://127.0.0.1:${ENVD_PORT} CODE_GATEWAY_AUTH=envd \
  CODE_GATEWAY_NODE=${ENVD_NODE} CODE_GATEWAY_PYTHON=/usr/bin/python3 \
  CODE_GATEWAY_PROCESS_LIMIT=${processLimit} CODE_GATEWAY_WORKLOAD_FD=${WORKLOAD_FD} \
  setsid -f /bin/sh -c 'while :; do ${ENVD_NODE} /opt/warren/code-gateway/dist/main.js; sleep 1; done' </dev/null
exec "$@"
`;

const ID_COUNT = 65536;

/** How soon a start is first asked again whether envd answers when its log says nothing new (InstanceContainersOptions). */
const DEFAULT_READY_POLL_MS = 25;
/**
 * The longest a start goes unasked while its log says nothing new: the fallback delay doubles up to this. envd logs
 * as it starts to listen, so the log's change ends the wait; the fallback only covers a log that cannot be watched.
 * At a fixed 25 ms, 20 sandboxes starting at once on a 2-core node (each ~5–10 s there) had the node agent open
 * ~800 connections and read ~800 /proc files a second, ~12 % of its CPU in a cold burst, taken from the starts.
 */
const MAX_READY_POLL_MS = 250;

/** How many times `readyTimeoutMs` a start that keeps using CPU may take: 45 s by default, within the 60 s the
 * E2B SDK waits for a create. */
const READY_PATIENCE = 3;
/** The span over which a slow start's CPU use is measured, and the extra time each busy span earns. */
const PROGRESS_WINDOW_MS = 2500;
/** The share of one core a slow start must have used lately to count as making progress. */
const MIN_PROGRESS_CPU_SHARE = 0.02;

/**
 * Whether the sandbox's /usr/local/bin/node, as its topmost layer has it, is the empty file Warren's recipes and
 * image preparation leave for the host's node to be bound over; an image's own node (or none) is left alone.
 */
async function hasNodePlaceholder(record: InstanceRecord): Promise<boolean> {
  for (const dir of [...(record.layers ?? []), record.lowerDir]) {
    const entry = await lstat(join(dir, USER_NODE)).catch(() => undefined);
    if (entry) return entry.isFile() && entry.size === 0;
  }
  return false;
}

/**
 * The process limit (RLIMIT_NPROC) of everything envd starts: the sandbox's pids limit minus a reserve that only
 * envd, tini and the code gateway can use, so a fork bomb stops short of the cgroup's limit and envd can still
 * start a command (as root when the bomb is the user's, as `user` when it is root's: sudo and kernels cannot raise a
 * hard limit in a sandbox) or signal the bomb. An eighth of the limit, 16 to 128.
 */
export function userProcessLimit(pidsMax: number): number {
  const reserve = Math.min(128, Math.max(16, Math.round(pidsMax / 8)));
  return Math.max(1, pidsMax - reserve);
}

/** Per-instance files bind-mounted into the sandbox. */
export const RESOLV_CONF = "/etc/resolv.conf";
export const BOOT_ID = "/proc/sys/kernel/random/boot_id";

/**
 * The writable layer and the overlay root over the template (and snapshot layers), at mount points the agent made
 * (`makeMountPoints`: one exec fewer per launch). The layer is an ext4 image of the sandbox's disk size
 * (sandbox-disks.ts): a ready one moved into place (`--move` is refused under a shared parent mount: then bound and
 * unmounted), or one made here from the formatted image; where the node cannot loop-mount, a size-limited tmpfs.
 * A launch onto a disk image (not a tmpfs) runs the same steps in `warren-exec --launch-sandbox` instead (keep
 * the two alike: envd/native/warren-exec.c).
 */
const MOUNT_ROOT = `set -e
D="$1"
if [ -n "$DISK_READY" ]; then
  mount --move "$DISK_READY" "$D/disk" 2>/dev/null || { mount --bind "$DISK_READY" "$D/disk"; umount "$DISK_READY"; }
else
  IMG="$D/disk.img"
  MNT="$D/disk"
  if [ -n "$DISK_TEMPLATE" ]; then
${MAKE_DISK}  else
    mount -t tmpfs -o "size=\${DISK_MIB}m,mode=0755,nodev" warren-disk "$D/disk"
${MAKE_LAYER_DIRS}  fi
fi
mount -t overlay -o "lowerdir=$LOWER,upperdir=$D/disk/upper,workdir=$D/disk/work" warren-root "$D/rootfs"
`;

const START_CONTAINER = `for f in $CGROUP_PROCS; do echo $$ > "$f"; done
exec 3>>"$WORKLOAD_PROCS" 4<"$WORKLOAD_OOM_CONTROL"
exec crun --root "$CRUN_ROOT" --cgroup-manager=disabled run --preserve-fds 2 --detach --bundle "$D/bundle" --pid-file "$D/pid" "$CID"
`;

const LAUNCHER = MOUNT_ROOT + START_CONTAINER;

/** A reboot: the disk and overlay are still mounted; only the container starts again. */
const RELAUNCHER = `set -e
D="$1"
${START_CONTAINER}`;

/** The cgroups a launched sandbox joins: all of the sandbox's, and the workload's descriptor for PID 1. */
export type LaunchCgroups = Pick<SandboxCgroup, "procsFiles" | "workloadProcsFile" | "workloadOomControlFile">;

export interface InstanceContainersOptions {
  /** Tag in each container's name (`warren-<instance>-<id>`). */
  readonly instance: string;
  /** crun's state directory for this agent's containers. */
  readonly crunRoot: string;
  readonly records: InstanceRecords;
  readonly uidBase: number;
  /**
   * The host's node binary, bind-mounted read-only at ENVD_NODE, and at /usr/local/bin/node where the template has
   * only a placeholder there (one copy of its pages per host).
   */
  readonly nodeBinary: string;
  /** Directory holding envd/, proto/, platform/ and node_modules/ (the repository root), bind-mounted read-only. */
  readonly envdRoot: string;
  readonly readyTimeoutMs: number;
  /**
   * While a start is waited for, envd is asked again at each change of the sandbox's log (envd logs as it starts to
   * listen), and when the log says nothing new first after this (default 25 ms), then after twice as long each time,
   * up to MAX_READY_POLL_MS (or this, when longer).
   */
  readonly readyPollMs?: number;
  /** Where writable layers come from (an ext4 image per sandbox, or tmpfs). */
  readonly disks: SandboxDisks;
}

/**
 * The crun side of an instance: its bundle and bind-mounted files, the launcher that mounts its root and starts
 * the container in its cgroups (sets `record.pid`/`pidStartTime` and persists the record), the wait until envd
 * (and the code gateway) answer, and removing containers. The caller owns the rest of the record.
 */
export class InstanceContainers {
  constructor(private readonly options: InstanceContainersOptions) {}

  containerId(instanceId: string): string {
    return `warren-${this.options.instance}-${instanceId}`;
  }

  /** envd's launcher of its esbuild bundle (one file, with a code cache: fast to load) when built, else tsc's output. */
  private get envdEntry(): string {
    return existsSync(join(this.options.envdRoot, "envd", "dist", "envd.cjs")) ? "envd.cjs" : "main.js";
  }

  /** envd's static launcher on the host (`envd/native/warren-exec.c`). */
  private get launcherBinary(): string {
    return envdLauncherPath(this.options.envdRoot);
  }

  /**
   * What envd starts behind: its command spawner (`warren-exec --serve-beside`, which forks the spawner and then
   * execs envd in place) when built, so envd's start forks nothing (a fork of a fresh Node.js process: ~8 ms of
   * its CPU here); else nothing (envd spawns the spawner itself).
   */
  private get envdSpawnerPrefix(): string[] {
    return existsSync(this.launcherBinary)
      ? ["/opt/warren/envd/dist/warren-exec", "--serve-beside", `--workload-fd=${WORKLOAD_FD}`, "--"]
      : [];
  }

  /**
   * The bundle (OCI config), boot id and resolv.conf of an instance: what crun and its bind mounts need. envd warms
   * up `now` in a pool's sandbox (nobody waits for it yet), `after-init` when a create waits: its /init then does
   * not queue behind the warm-up (about 70 ms here), which runs while the create's answer travels to the user.
   */
  async writeFiles(
    record: InstanceRecord,
    slot: NetworkSlot,
    command: readonly string[] | undefined,
    warmUp: "now" | "after-init",
  ): Promise<void> {
    const dir = this.options.records.dir(record.instanceId);
    // envd's commands and the gateway's kernels (RLIMIT_NPROC): both stop short of the pids limit.
    const processLimit = userProcessLimit(record.resources.pidsMax);
    const envd = [
      // No V8 flags (envd's, the code gateway's): V8 rejects the code cache Node.js ships for its own modules when
      // any V8 flag differs from its default, and every start then compiles them again (18–20 ms of CPU here; a
      // cold start p50 126–130 → 107–110 ms, 2026-12-05). V8 sizes the heap from the host's memory instead of
      // half the sandbox's: the sandbox's memory cgroup bounds it, and the young generation starts at 1 MiB anyway
      // (idle memory per sandbox 15.6 → 15.1 MiB).
      ...this.envdSpawnerPrefix,
      ENVD_NODE,
      `/opt/warren/envd/dist/${this.envdEntry}`,
      "--host",
      "0.0.0.0",
      "--port",
      String(ENVD_PORT),
      "--default-user",
      "user",
      // Ports sandbox processes listen on at loopback only are reachable through the proxy, as on E2B.
      "--expose-loopback",
      "--process-limit",
      String(processLimit),
      "--workload-fd",
      String(WORKLOAD_FD),
      "--workload-oom-fd",
      String(WORKLOAD_OOM_FD),
      "--warm-up",
      warmUp,
    ];
    const init = record.codeGateway ? ["/bin/sh", "-c", sandboxInit(processLimit), "sandbox-init"] : [];
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
        { source: this.options.nodeBinary, destination: ENVD_NODE },
        ...((await hasNodePlaceholder(record)) ? [{ source: this.options.nodeBinary, destination: USER_NODE }] : []),
        { source: join(this.options.envdRoot, "envd"), destination: "/opt/warren/envd" },
        { source: join(this.options.envdRoot, "proto"), destination: "/opt/warren/proto" },
        // `@warren/platform` (the logger, env parsing) for the code gateway and an unbundled envd: node_modules
        // holds only a symlink to it.
        { source: join(this.options.envdRoot, "platform"), destination: "/opt/warren/platform" },
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
      volumes: record.volumes ?? [],
    });
    await writeFile(join(dir, "boot_id"), `${randomUUID()}\n`);
    // DNS goes to the node's egress gateway at the host side of the veth (its rules redirect any port-53 UDP).
    await writeFile(join(dir, "resolv.conf"), `nameserver ${slot.hostAddr}\noptions timeout:2 attempts:2\n`);
    await writeFile(join(dir, "bundle", "config.json"), JSON.stringify(config));
  }

  /** Mounts the instance's writable layer and root, then starts its container in the cgroups of `procsFiles`. */
  async launch(record: InstanceRecord, cgroup: LaunchCgroups): Promise<void> {
    await this.makeMountPoints(record);
    return this.startContainer(record, cgroup, LAUNCHER, await this.diskLaunch(record));
  }

  /** Starts the container again over the root that is still mounted (a reboot). */
  relaunch(record: InstanceRecord, cgroup: LaunchCgroups): Promise<void> {
    return this.startContainer(record, cgroup, RELAUNCHER);
  }

  /** Mounts the writable layer and root only (a CRIU restore then brings the processes). */
  async mountRoot(record: InstanceRecord, cgroup: LaunchCgroups): Promise<void> {
    await this.makeMountPoints(record);
    return this.runLauncher(record, cgroup, MOUNT_ROOT, await this.diskLaunch(record));
  }

  /** MOUNT_ROOT's mount points: the writable layer's and the root's. */
  private async makeMountPoints(record: InstanceRecord): Promise<void> {
    const dir = this.options.records.dir(record.instanceId);
    await mkdir(join(dir, "disk"), { recursive: true });
    await mkdir(join(dir, "rootfs"), { recursive: true });
  }

  private diskLaunch(record: InstanceRecord): Promise<DiskLaunch> {
    return this.options.disks.forInstance(this.options.records.dir(record.instanceId), record.resources.diskSizeMB);
  }

  private async startContainer(
    record: InstanceRecord,
    cgroup: LaunchCgroups,
    script: string,
    disk: DiskLaunch = {},
  ): Promise<void> {
    await this.runLauncher(record, cgroup, script, disk);
    const pid = Number((await readFile(join(this.options.records.dir(record.instanceId), "pid"), "utf8")).trim());
    record.pid = pid;
    record.pidStartTime = await processStartTime(pid);
    await this.options.records.persist(record);
  }

  private async runLauncher(
    record: InstanceRecord,
    cgroup: LaunchCgroups,
    script: string,
    disk: DiskLaunch = {},
  ): Promise<void> {
    const dir = this.options.records.dir(record.instanceId);
    try {
      // Through the node agent's tool spawner (exec): a fork of the agent itself blocked its event loop ~20–30 ms
      // per launch. The script sends its own output, and so the sandbox's (crun, envd and the code gateway inherit
      // it), to envd.log: nothing holds the spawner's pipes once the container has started.
      // A launch onto a disk image (a ready one, or one made now from the formatted image) is envd's static
      // launcher's own (`warren-exec --launch-sandbox`: disk and mounts by system call, then crun), LAUNCHER's steps.
      const direct =
        script === LAUNCHER &&
        (disk.DISK_READY !== undefined || disk.DISK_TEMPLATE !== undefined) &&
        existsSync(this.launcherBinary);
      const [file, args] = direct
        ? [this.launcherBinary, ["--launch-sandbox", dir]]
        : ["sh", ["-c", `exec >>"$1/envd.log" 2>&1\n${script}`, "launcher", dir]];
      const { code } = await exec(file, args, {
        env: {
          DISK_MIB: String(record.resources.diskSizeMB),
          ...disk,
          UID_BASE: String(this.options.uidBase),
          LOWER: [...(record.layers ?? []), record.lowerDir].join(":"),
          CGROUP_PROCS: cgroup.procsFiles.join(" "),
          WORKLOAD_PROCS: cgroup.workloadProcsFile,
          WORKLOAD_OOM_CONTROL: cgroup.workloadOomControlFile,
          CRUN_ROOT: this.options.crunRoot,
          CID: this.containerId(record.instanceId),
        },
        allowFailure: true,
      });
      if (code !== 0) {
        const tail = (await readFile(join(dir, "envd.log"), "utf8").catch(() => "")).slice(-500);
        throw new Error(`sandbox launcher failed (${code}): ${tail.trim()}`);
      }
    } finally {
      await this.options.disks.launched(disk);
    }
  }

  /**
   * Resolves once envd (and the code gateway, in code templates) answer; throws if the sandbox exits first, or
   * stops making progress. Past `readyTimeoutMs` a sandbox that is still using CPU is slow (a loaded node: the
   * code gateway's kernels and envd start on the same cores as every other sandbox), not stuck, and gets more time,
   * up to READY_PATIENCE times the timeout; one that sits idle fails at the timeout.
   */
  async waitReady(record: InstanceRecord, cgroup: Pick<SandboxCgroup, "usage">, log: Logger): Promise<void> {
    const { readyTimeoutMs } = this.options;
    const started = Date.now();
    const ceiling = started + readyTimeoutMs * READY_PATIENCE;
    let deadline = started + readyTimeoutMs;
    const cpuUsec = () =>
      cgroup.usage().then(
        (u) => u.cpuUsec,
        () => 0,
      );
    // CPU samples taken every PROGRESS_WINDOW_MS: the latest and the one before it.
    let earlier = { at: started, cpuUsec: await cpuUsec() };
    let latest = earlier;
    let envdUp = false;
    const changes = new LogChanges(join(this.options.records.dir(record.instanceId), "envd.log"));
    const firstPollMs = this.options.readyPollMs ?? DEFAULT_READY_POLL_MS;
    let pollMs = firstPollMs;
    try {
      for (let attempt = 0; ; attempt++) {
        envdUp ||= await healthy(record.addr, 250);
        if (envdUp && (!record.codeGateway || (await healthy(record.addr, 250, CODE_GATEWAY_PORT)))) return;
        const waiting = envdUp ? "the code gateway" : "envd";
        if (!record.pid || (await processStartTime(record.pid)) !== record.pidStartTime) {
          const logPath = join(this.options.records.dir(record.instanceId), "envd.log");
          const tail = (await readFile(logPath, "utf8").catch(() => "")).slice(-500).trim();
          throw new Error(`sandbox exited before ${waiting} answered: ${tail}`);
        }
        let now = Date.now();
        if (now - latest.at >= PROGRESS_WINDOW_MS) {
          earlier = latest;
          latest = { at: now, cpuUsec: await cpuUsec() };
        }
        if (now > deadline) {
          // Progress over the last half window or more: the latest sample when it is that old, else the one before.
          const since = now - latest.at >= PROGRESS_WINDOW_MS / 2 ? latest : earlier;
          const current = await cpuUsec();
          now = Date.now();
          const usedMs = Math.round((current - since.cpuUsec) / 1000);
          const windowMs = now - since.at;
          if (usedMs < windowMs * MIN_PROGRESS_CPU_SHARE || now > ceiling) {
            throw new Error(
              `${waiting} did not answer within ${now - started} ms (the sandbox used ${usedMs} ms of CPU in its last ${windowMs} ms)`,
            );
          }
          deadline = Math.min(now + PROGRESS_WINDOW_MS, ceiling);
          log.info("sandbox still starting on a busy node: waiting longer", { waiting, usedMs, windowMs });
        }
        if (attempt % 100 === 99) log.debug("still waiting for envd", { attempt });
        const logChanged = await changes.next(pollMs);
        if (!logChanged) pollMs = Math.min(pollMs * 2, Math.max(MAX_READY_POLL_MS, firstPollMs));
      }
    } finally {
      changes.close();
    }
  }

  /**
   * Removes the instance's container from crun's state, whatever state it is in (none is fine). A container whose
   * init is gone (a teardown has killed every process in the sandbox's cgroups first) is nothing but crun's state
   * directory — no hooks, no cgroups of crun's own (--cgroup-manager=disabled) — so it is removed here, without an
   * exec of `crun delete` (~5–8 ms of CPU per teardown on the 2-CPU machines Warren is measured on). A container
   * still running, or one whose state cannot be read, goes through crun.
   */
  async remove(instanceId: string): Promise<void> {
    const state = join(this.options.crunRoot, this.containerId(instanceId));
    if (!existsSync(state)) return;
    if (await initGone(state)) {
      await rm(state, { recursive: true, force: true });
      return;
    }
    await exec("crun", ["--root", this.options.crunRoot, "delete", "-f", this.containerId(instanceId)], {
      allowFailure: true,
    });
  }

  /** Removes every container of this agent whose instance `known` does not accept (orphans after a crash). */
  async removeUnknown(known: (instanceId: string) => boolean): Promise<void> {
    const crunList = await exec("crun", ["--root", this.options.crunRoot, "list", "-q"], { allowFailure: true });
    for (const cid of crunList.stdout.split("\n").filter(Boolean)) {
      const instanceId = cid.slice(this.containerId("").length);
      if (!known(instanceId))
        await exec("crun", ["--root", this.options.crunRoot, "delete", "-f", cid], { allowFailure: true });
    }
  }
}

/**
 * Whether the init process crun recorded for a container (its `status`: pid and start time) no longer runs: no such
 * process, a zombie (dead, not yet reaped by the process it was reparented to), or another process reusing the pid.
 * False when the status cannot be read.
 */
async function initGone(stateDir: string): Promise<boolean> {
  let status: { pid?: unknown; "process-start-time"?: unknown };
  try {
    status = JSON.parse(await readFile(join(stateDir, "status"), "utf8"));
  } catch {
    return false;
  }
  const pid = status.pid;
  if (typeof pid !== "number" || !Number.isInteger(pid) || pid <= 0) return false;
  let stat: string;
  try {
    stat = await readFile(`/proc/${pid}/stat`, "utf8");
  } catch {
    return true;
  }
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return fields[0] === "Z" || fields[19] !== String(status["process-start-time"]);
}
