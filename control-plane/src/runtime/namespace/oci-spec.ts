import { sandboxSeccomp } from "./seccomp.js";

/**
 * The OCI runtime spec crun starts a sandbox from. Everything a sandbox is allowed is written here:
 * namespaces, the user-namespace id mapping, capabilities, seccomp, masked /proc paths and the read-only binds
 * of the host's node binary and envd.
 */
export interface SandboxSpecInput {
  /** The mounted overlay that becomes `/`. */
  readonly rootfs: string;
  /** The pre-made network namespace to join. */
  readonly netnsPath: string;
  readonly uidBase: number;
  readonly idCount: number;
  readonly allowSetuid: boolean;
  readonly args: readonly string[];
  readonly env: readonly string[];
  readonly hostBinds: readonly { readonly source: string; readonly destination: string }[];
  /**
   * Read-write binds of team volumes. Idmapped with the sandbox's own mapping, so a file's owner on disk is its
   * owner inside: sandboxes with different host uid ranges share a volume with the same owners, and the content
   * API's ids mean the same in every sandbox.
   */
  readonly volumes?: readonly { readonly source: string; readonly destination: string }[];
}

/**
 * What sandbox root (host uid `uidBase`, powerless outside) keeps inside its user namespace: enough to run
 * envd as root (file ownership, setuid to `user`, signals) and `sudo`; no CAP_SYS_ADMIN, CAP_NET_ADMIN,
 * CAP_SYS_MODULE, CAP_SYS_TIME, CAP_SYS_PTRACE, CAP_MKNOD, CAP_NET_RAW.
 */
export const SANDBOX_CAPABILITIES = [
  "CAP_CHOWN",
  "CAP_DAC_OVERRIDE",
  "CAP_DAC_READ_SEARCH",
  "CAP_FOWNER",
  "CAP_FSETID",
  "CAP_KILL",
  "CAP_SETGID",
  "CAP_SETUID",
  "CAP_SETPCAP",
  "CAP_NET_BIND_SERVICE",
  "CAP_AUDIT_WRITE",
  "CAP_SETFCAP",
] as const;

const RO_BIND = ["rbind", "ro", "nosuid", "nodev"];

export function sandboxSpec(input: SandboxSpecInput): Record<string, unknown> {
  const caps = [...SANDBOX_CAPABILITIES];
  return {
    ociVersion: "1.0.2",
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: [...input.args],
      env: [...input.env],
      cwd: "/",
      capabilities: { bounding: caps, effective: caps, permitted: caps },
      // Off only where the template needs `sudo` (setuid); see ../README-namespace in driver.ts.
      noNewPrivileges: !input.allowSetuid,
      // Under global memory pressure the kernel kills sandbox processes before the node's own.
      oomScoreAdj: 500,
    },
    root: { path: input.rootfs, readonly: false },
    hostname: "sandbox",
    mounts: [
      { destination: "/proc", type: "proc", source: "proc", options: ["nosuid", "noexec", "nodev"] },
      {
        destination: "/dev",
        type: "tmpfs",
        source: "tmpfs",
        options: ["nosuid", "strictatime", "mode=755", "size=65536k"],
      },
      {
        destination: "/dev/pts",
        type: "devpts",
        source: "devpts",
        options: ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
      },
      {
        destination: "/dev/shm",
        type: "tmpfs",
        source: "shm",
        options: ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
      },
      { destination: "/dev/mqueue", type: "mqueue", source: "mqueue", options: ["nosuid", "noexec", "nodev"] },
      // No sysfs: the host's /sys (devices, firmware, kernel tunables) stays out of sight.
      { destination: "/sys", type: "tmpfs", source: "tmpfs", options: ["nosuid", "noexec", "nodev", "ro", "size=4k"] },
      ...input.hostBinds.map((bind) => ({
        destination: bind.destination,
        type: "bind",
        source: bind.source,
        options: RO_BIND,
      })),
      ...(input.volumes ?? []).map((volume) => ({
        destination: volume.destination,
        type: "bind",
        source: volume.source,
        options: ["rbind", "nosuid", "nodev", "idmap"],
        uidMappings: [{ containerID: 0, hostID: input.uidBase, size: input.idCount }],
        gidMappings: [{ containerID: 0, hostID: input.uidBase, size: input.idCount }],
      })),
    ],
    linux: {
      uidMappings: [{ containerID: 0, hostID: input.uidBase, size: input.idCount }],
      gidMappings: [{ containerID: 0, hostID: input.uidBase, size: input.idCount }],
      namespaces: [
        { type: "pid" },
        { type: "ipc" },
        { type: "uts" },
        { type: "mount" },
        { type: "cgroup" },
        { type: "user" },
        { type: "network", path: input.netnsPath },
      ],
      seccomp: sandboxSeccomp(),
      maskedPaths: [
        "/proc/acpi",
        "/proc/asound",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/proc/kallsyms",
        "/proc/config.gz",
      ],
      readonlyPaths: ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    },
  };
}
