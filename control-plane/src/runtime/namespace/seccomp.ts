/**
 * The sandbox's seccomp filter, as an OCI `linux.seccomp` object (crun compiles it with libseccomp and loads it
 * before exec'ing the sandbox's first process; every descendant inherits it).
 *
 * Default allow, then deny (EPERM) what a sandbox never needs and what widens the kernel attack surface:
 * mounting and namespace games (the user namespace would otherwise grant them inside the sandbox), kernel modules,
 * kexec, reboot, swap, BPF, perf, keyrings, clock setting, accounting and quota control, io_uring, and the
 * file-handle calls of the "shocker" escape. `clone` is allowed without namespace flags only, and `clone3` answers
 * ENOSYS so libc falls back to `clone`, whose flags a filter can inspect (the Docker/Podman approach).
 *
 * `pkey_alloc` answers ENOSPC, as on a CPU without memory protection keys: CRIU does not carry a process's
 * allocated keys through a checkpoint, and V8 protects its WebAssembly code with one where the CPU has PKU, so every
 * Node.js process in a sandbox (envd, the code gateway, a user's server) died on its next WebAssembly compile after
 * a restore ("Commit wasm code space Allocation failed - process out of memory": its `pkey_mprotect` with a key the
 * restored process no longer owns). Without a key V8 leaves that code unprotected, as on such a CPU.
 */
const DENIED: readonly string[] = [
  // filesystems and namespaces
  "mount",
  "umount",
  "umount2",
  "pivot_root",
  "move_mount",
  "open_tree",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "mount_setattr",
  "unshare",
  "setns",
  "chroot",
  // the kernel itself
  "init_module",
  "finit_module",
  "delete_module",
  "create_module",
  "kexec_load",
  "kexec_file_load",
  "reboot",
  "swapon",
  "swapoff",
  "bpf",
  "perf_event_open",
  "syslog",
  "acct",
  "quotactl",
  "quotactl_fd",
  "lookup_dcookie",
  "iopl",
  "ioperm",
  "nfsservctl",
  "uselib",
  "vhangup",
  "userfaultfd",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
  // keys
  "add_key",
  "request_key",
  "keyctl",
  // clocks
  "clock_settime",
  "clock_adjtime",
  "settimeofday",
  "stime",
  "adjtimex",
  // file handles (open_by_handle_at escapes)
  "open_by_handle_at",
  "name_to_handle_at",
  // host identity
  "sethostname",
  "setdomainname",
];

/** CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME */
const CLONE_NAMESPACE_FLAGS = [
  0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80,
];

const EPERM = 1;
const ENOSPC = 28;
const ENOSYS = 38;

export interface OciSeccomp {
  defaultAction: string;
  architectures: string[];
  syscalls: {
    names: string[];
    action: string;
    errnoRet?: number;
    args?: { index: number; value: number; valueTwo?: number; op: string }[];
  }[];
}

export function sandboxSeccomp(): OciSeccomp {
  return {
    defaultAction: "SCMP_ACT_ALLOW",
    architectures: ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    syscalls: [
      { names: [...DENIED], action: "SCMP_ACT_ERRNO", errnoRet: EPERM },
      { names: ["clone3"], action: "SCMP_ACT_ERRNO", errnoRet: ENOSYS },
      { names: ["pkey_alloc"], action: "SCMP_ACT_ERRNO", errnoRet: ENOSPC },
      // x86-64 clone(flags, ...): one rule per namespace flag, denying calls that set it.
      ...CLONE_NAMESPACE_FLAGS.map((flag) => ({
        names: ["clone"],
        action: "SCMP_ACT_ERRNO",
        errnoRet: EPERM,
        args: [{ index: 0, value: flag, valueTwo: flag, op: "SCMP_CMP_MASKED_EQ" }],
      })),
    ],
  };
}

export const SECCOMP_DENIED_SYSCALLS = DENIED;
