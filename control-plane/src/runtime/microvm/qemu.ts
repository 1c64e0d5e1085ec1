import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { open, readFile, rm } from "node:fs/promises";
import { connect } from "node:net";
import { basename, dirname, join } from "node:path";
import { processStartTime } from "../sandbox-process.js";
import { GUEST_MAC, type GuestKernel } from "./guest-image.js";
import { jailArgs, prepareJail, qemuJailSyntax, type VmJail } from "./jail.js";

export { processStartTime };
export type { VmJail };

export type Accel = "kvm" | "tcg";

/** Where a VM's files live: `<dir>/{qmp.sock,console.log,qemu.pid}`. */
export interface VmLaunch {
  readonly name: string;
  readonly dir: string;
  readonly netnsPath: string;
  readonly kernel: GuestKernel;
  /** The VM's qcow2 disk (copy-on-write over the template's). */
  readonly disk: string;
  readonly memoryMB: number;
  readonly vcpus: number;
  readonly accel: Accel;
  /** Restore from this memory snapshot (QEMU waits paused for `cont`) instead of booting. */
  readonly incoming?: string;
  /**
   * Guest RAM as a file mapping (see `ramArgs`): `shared` for the VM a template snapshot is built from (its RAM
   * ends up in the file), private (copy-on-write) for the VMs restored from that snapshot. Absent: anonymous
   * memory, all of it in the migration stream.
   */
  readonly ram?: { readonly path: string; readonly shared: boolean };
  /** `cgroup.procs` files the launcher joins before exec'ing QEMU (vm-cgroups.ts): the daemon starts in them. */
  readonly cgroupProcs?: readonly string[];
  /**
   * Once set up, QEMU drops to this uid/gid (no capabilities left) and chroots into `dir` (see `jailArgs`).
   * Absent: it stays root where it started (tests of the launcher only).
   */
  readonly jail?: VmJail;
}

/**
 * The guest kernel's command line. Under TCG the kernel is told the TSC's frequency (`tsc_early_khz`; TCG's
 * guest TSC runs at the host's): without it, the 6.1 kernel's early timer calibration against the PIT failed
 * under load and the boot waited forever for a timer interrupt ("Marking TSC unstable", no output after it; 8
 * of 15 cold boots on this machine while other tests ran, 0 of 10 with it). This is the "~14 % hung TCG boots"
 * of RUNTIME-NOTES §3.4, worse under load. Snapshots record the command line in their key.
 */
export function kernelCmdline(accel: Accel): string {
  const base = "console=ttyS0 quiet no_timer_check panic=1 warren.init=/opt/warren/init";
  return accel === "tcg" ? `${base} tsc_early_khz=${hostTscKhz()}` : base;
}

let tscKhz: number | undefined;

/** The host's TSC frequency in kHz (/proc/cpuinfo's "cpu MHz", right on hosts with a constant TSC). */
function hostTscKhz(): number {
  if (tscKhz === undefined) {
    const mhz = Number(/^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1]);
    tscKhz = Number.isFinite(mhz) && mhz > 100 ? Math.round(mhz * 1000) : 2_000_000;
  }
  return tscKhz;
}

/**
 * TCG's translation cache (see qemuArgs), QEMU 7.2's default. Guests fill it with the code they run (a restored
 * guest's envd alone: ~66 MiB in seconds; up to 452 MiB in the microvm test suites here) and it stays resident. A
 * smaller one is flushed and refilled so often that guests crawl: at 128 MiB, guest commands of the snapshot
 * and fork tests ran past their deadlines on this loaded machine.
 */
export const TCG_TB_SIZE_MIB = 1024;

/** Paths we put into `exec:` migration URIs (run by /bin/sh): nothing a shell would interpret. */
export function shellSafe(path: string): string {
  if (!/^[A-Za-z0-9_./-]+$/.test(path)) throw new Error(`path not allowed in a migration URI: '${path}'`);
  return path;
}

/**
 * The QEMU command line (RUNTIME-NOTES §3.3), with what this machine needed beyond it:
 * - `-cpu max,-tsc-deadline` under TCG: with the TSC-deadline timer TCG never delivered a timer interrupt to
 *   Debian's 6.1 kernel here (boots stuck at "Marking TSC unstable", jiffies never advancing, 8 of 8); without
 *   it the kernel falls back to the LAPIC one-shot timer and boots. Under KVM, `-cpu host`.
 * - `rtc=on`: a cold-booted guest takes its clock from the RTC, which follows the host's.
 * - the serial console is a unix socket (the driver writes the clock to the guest through it after every `cont`,
 *   see guest-image.ts) whose output is appended to `console.log`, so a restore keeps the boot's log.
 * - `-sandbox on` (seccomp): no obsolete syscalls, no resource control; spawning stays allowed because `exec:`
 *   migration (QEMU 7.2 has no `file:` URI) runs `cat`; `elevateprivileges=deny` makes `-daemonize` fail here.
 * - TCG's translation cache size (`tb-size`, MiB) is given explicitly, at QEMU 7.2's default: it counts in the
 *   memory limit of QEMU's cgroup (vm-cgroups.ts), so it must not follow a default that changes with QEMU.
 * QEMU daemonizes once the machine is set up (`-pidfile`); it is not the agent's child, so VMs survive an agent
 * restart and are re-adopted.
 */
export function qemuArgs(launch: VmLaunch): string[] {
  const args = [
    `--net=${launch.netnsPath}`,
    "qemu-system-x86_64",
    "-name",
    launch.name,
    "-M",
    `microvm,x-option-roms=off,isa-serial=on,rtc=on${launch.ram ? `,memory-backend=${RAM_ID}` : ""}`,
    "-accel",
    launch.accel === "tcg" ? `tcg,tb-size=${TCG_TB_SIZE_MIB}` : launch.accel,
    "-cpu",
    launch.accel === "kvm" ? "host" : "max,-tsc-deadline",
    "-m",
    String(launch.memoryMB),
    "-smp",
    String(launch.vcpus),
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-sandbox",
    "on,obsolete=deny,resourcecontrol=deny",
    "-chardev",
    `socket,id=console,path=${join(launch.dir, "console.sock")},server=on,wait=off,logfile=${join(launch.dir, "console.log")},logappend=on`,
    "-serial",
    "chardev:console",
    "-qmp",
    `unix:${join(launch.dir, "qmp.sock")},server=on,wait=off`,
    "-kernel",
    launch.kernel.vmlinux,
    "-initrd",
    launch.kernel.initramfs,
    "-append",
    kernelCmdline(launch.accel),
    "-netdev",
    "tap,id=n0,ifname=tap0,script=no,downscript=no",
    "-device",
    `virtio-net-device,netdev=n0,mac=${GUEST_MAC}`,
    "-drive",
    `file=${diskPath(launch)},if=none,id=d0,format=qcow2`,
    "-device",
    "virtio-blk-device,drive=d0",
    "-daemonize",
    "-pidfile",
    join(launch.dir, "qemu.pid"),
  ];
  if (launch.ram) args.push(...ramArgs(launch.ram, launch.memoryMB));
  // The launcher opens the memory file as fd 3 (as root, before any chroot): QEMU reads it without a path. A
  // restore over a RAM file waits (`defer`) for its migration capability to be set (finishRestore).
  if (launch.incoming) args.push("-incoming", launch.ram ? "defer" : `fd:${INCOMING_FD}`);
  if (launch.jail) args.push(...jailArgs(launch.dir, launch.jail, qemuJailSyntax()));
  return args;
}

export const INCOMING_FD = 3;

/**
 * The machine's default RAM block name, kept for the file-backed RAM: migration streams name RAM blocks, and a
 * VM restored from a template snapshot (file-backed) is later checkpointed or snapshotted into a stream that a VM
 * with ordinary RAM loads.
 */
const RAM_ID = "microvm.ram";

/**
 * Guest RAM backed by a file, for template snapshots (Firecracker's way of restoring snapshots, done with QEMU's
 * `x-ignore-shared` migration capability): the VM a template snapshot is built from maps `ram` shared, so at
 * `stop` its RAM *is* the file, and its migration stream (with `x-ignore-shared`) holds device state only. A VM
 * restored from the snapshot maps the same file private (copy-on-write): nothing is read at restore, pages come
 * from the page cache when the guest touches them — shared by every sandbox of that template — and only the
 * pages a sandbox writes are its own. The file never changes once built (a private mapping of a file that
 * changes would see the changes).
 */
function ramArgs(ram: { readonly path: string; readonly shared: boolean }, memoryMB: number): string[] {
  return [
    "-object",
    `memory-backend-file,id=${RAM_ID},size=${memoryMB}M,mem-path=${ram.path},share=${ram.shared ? "on" : "off"}`,
  ];
}

/**
 * The disk as QEMU names it. Jailed, relative to its directory (QEMU's working directory at start, its root
 * after the chroot): QEMU opens the file again by name whenever its block layer changes the disk's permissions —
 * read-only when a migration hands the disk over (every snapshot and checkpoint), read-write on `cont` and after
 * a restore — and the absolute host path does not exist inside the chroot. The backing chain (read-only from the
 * start) is never reopened, so its absolute paths are fine.
 */
function diskPath(launch: VmLaunch): string {
  return launch.jail && dirname(launch.disk) === launch.dir ? basename(launch.disk) : launch.disk;
}

/**
 * Joins the cgroup (every `cgroup.procs` file in `$CGROUP_PROCS`), then becomes nsenter → QEMU: the daemon QEMU
 * forks is born in the cgroup, as the namespace driver's launcher does for crun.
 */
const LAUNCHER = `set -e
for f in $CGROUP_PROCS; do echo $$ > "$f"; done
if [ -n "$INCOMING" ]; then exec 3<"$INCOMING"; fi
exec nsenter "$@"
`;

/** Starts QEMU in the sandbox's network namespace (and cgroup); resolves with its pid once it has daemonized. */
export async function launchVm(launch: VmLaunch): Promise<number> {
  await rm(join(launch.dir, "qemu.pid"), { force: true });
  await rm(join(launch.dir, "qmp.sock"), { force: true });
  await rm(join(launch.dir, "console.sock"), { force: true });
  if (launch.jail) await prepareJail(launch.dir, launch.disk, launch.jail);
  const log = await open(join(launch.dir, "qemu.log"), "a");
  try {
    const code = await new Promise<number>((resolve, reject) => {
      const child = spawn("sh", ["-c", LAUNCHER, "launcher", ...qemuArgs(launch)], {
        env: {
          PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
          CGROUP_PROCS: (launch.cgroupProcs ?? []).join(" "),
          INCOMING: launch.incoming ?? "",
        },
        stdio: ["ignore", log.fd, log.fd],
        // A jailed QEMU names its disk relative to its directory (diskPath).
        cwd: launch.dir,
        timeout: 60_000,
      });
      child.once("error", reject);
      child.once("exit", (exitCode) => resolve(exitCode ?? 1));
    });
    if (code !== 0) {
      const tail = (await readFile(join(launch.dir, "qemu.log"), "utf8").catch(() => "")).slice(-500).trim();
      throw new Error(`qemu failed to start (${code}): ${tail}`);
    }
  } finally {
    await log.close();
  }
  return Number((await readFile(join(launch.dir, "qemu.pid"), "utf8")).trim());
}

/** Ends a QEMU process (SIGKILL) if it is still the one we started, and waits until it is gone. */
export async function killVm(pid: number | undefined, startTime: string | undefined): Promise<void> {
  if (pid === undefined || startTime === undefined) return;
  if ((await processStartTime(pid)) !== startTime) return;
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return;
  }
  await waitGone(pid, startTime, 10_000);
}

export async function waitGone(pid: number, startTime: string, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const now = await processStartTime(pid);
    // A zombie still has its stat; QEMU is daemonized (re-parented away), so it is reaped by init quickly.
    if (now !== startTime) return true;
    const state = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
    if (state.slice(state.lastIndexOf(")") + 2).startsWith("Z")) return true;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return false;
}

/** Resident memory (bytes) and CPU time (µs) of a QEMU process. */
export async function processUsage(pid: number): Promise<{ rssBytes: number; cpuUsec: number }> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const rssKiB = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? 0);
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
  return { rssBytes: rssKiB * 1024, cpuUsec: Math.round((ticks * 1e6) / 100) };
}

/**
 * Sends one line to the guest's console listener (guest-image.ts) and waits for its acknowledgement line.
 * Resolves with what follows `ack` on that line (trimmed), or undefined when the guest did not answer in time.
 */
export function guestCommand(
  consolePath: string,
  line: string,
  ack: string,
  timeoutMs: number,
): Promise<string | undefined> {
  return new Promise((resolve) => {
    const socket = connect(consolePath);
    let seen = "";
    const done = (rest: string | undefined) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(rest);
    };
    const timer = setTimeout(() => done(undefined), timeoutMs);
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      seen = (seen + chunk).slice(-400);
      const at = seen.indexOf(ack);
      const end = at < 0 ? -1 : seen.indexOf("\n", at);
      if (end >= 0) done(seen.slice(at + ack.length, end).trim());
    });
    socket.once("error", () => done(undefined));
    socket.once("connect", () => socket.write(`${line}\n`));
  });
}

/**
 * Sets the guest's wall clock to the host's (to the second) and waits until the guest confirms. With `seed`, the
 * guest also feeds those bytes to its kernel's entropy pool and forces a reseed of its random number generator
 * (guest-image.ts): a guest restored from a snapshot shares the CRNG state of every other restore of it. Resolves
 * with what the guest did with the seed ("reseeded", "mixed": written to the pool only, "": no seed), or
 * undefined when it did not answer.
 */
export function syncGuestClock(consolePath: string, timeoutMs: number, seed?: Buffer): Promise<string | undefined> {
  const now = String(Math.floor(Date.now() / 1000));
  const line = seed ? `warren-clock ${now} ${seed.toString("hex")}` : `warren-clock ${now}`;
  return guestCommand(consolePath, line, `WARREN-CLOCK-SET ${now}`, timeoutMs);
}

/** Ends the guest's processes (their connections close) and flushes its disk; resolves when the guest confirms. */
export function stopGuest(consolePath: string, timeoutMs: number): Promise<boolean> {
  const tag = String(Date.now());
  return guestCommand(consolePath, `warren-stop ${tag}`, `WARREN-STOPPED ${tag}`, timeoutMs).then(
    (rest) => rest !== undefined,
  );
}
