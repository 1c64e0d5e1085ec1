import { spawn } from "node:child_process";
import { accessSync, constants, existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { GuestKernel } from "./guest-image.js";

/**
 * The capability probe: which runtime driver this node runs. `kvm` only when a tiny guest really boots under
 * KVM within a deadline: `/dev/kvm` alone proves nothing (on our CI machines it is a nested PVM device on which
 * stock kernels die with emulation failures, RUNTIME-NOTES §3.2). Software emulation (`microvm-tcg`) is never
 * chosen by itself: it exists so CI can exercise the microvm driver, and must be asked for.
 */
export type DriverRequest = "auto" | "namespace" | "microvm" | "microvm-tcg";
export type DriverChoice = "namespace" | "microvm" | "microvm-tcg";

export const DRIVER_REQUESTS: readonly DriverRequest[] = ["auto", "namespace", "microvm", "microvm-tcg"];

/** What the probe looks at; gathered by `hostFacts`, injected by unit tests. */
export interface HostFacts {
  readonly kvmDevice: boolean;
  /** Loaded KVM modules (kvm_intel, kvm_amd, kvm_pvm, ...). */
  readonly kvmModules: readonly string[];
  /** qemu-system-x86_64 on PATH. */
  readonly qemu: boolean;
  /** The unpacked guest kernel (scripts/setup-host.sh) is there. */
  readonly guestKernel: boolean;
  /** Other VMMs found on PATH (reported, not used yet). */
  readonly otherVmms: readonly string[];
}

export interface BootTestResult {
  readonly booted: boolean;
  readonly detail: string;
}

export interface ProbeResult {
  readonly driver: DriverChoice;
  /** Why, step by step (logged at agent start). */
  readonly reasons: readonly string[];
}

export class ProbeError extends Error {
  constructor(
    message: string,
    readonly reasons: readonly string[],
  ) {
    super(message);
    this.name = "ProbeError";
  }
}

/**
 * Decides the driver. `bootTest` is called only when real KVM is plausible (a KVM module other than PVM) or when
 * `microvm` is demanded. An explicit `microvm` or `microvm-tcg` that cannot be honoured is an error, not a silent
 * fallback.
 */
export async function decideDriver(
  request: DriverRequest,
  facts: HostFacts,
  bootTest: () => Promise<BootTestResult>,
): Promise<ProbeResult> {
  const reasons: string[] = [];
  if (facts.otherVmms.length > 0) {
    reasons.push(`found ${facts.otherVmms.join(", ")}; this driver uses QEMU microvm only (not yet those)`);
  }
  if (request === "namespace") {
    reasons.push("WARREN_DRIVER=namespace");
    return { driver: "namespace", reasons };
  }
  const missing = [
    ...(facts.qemu ? [] : ["qemu-system-x86_64 (Debian qemu-system-x86)"]),
    ...(facts.guestKernel ? [] : ["the guest kernel (scripts/setup-host.sh)"]),
  ];
  if (request === "microvm-tcg") {
    if (missing.length > 0)
      throw new ProbeError(`WARREN_DRIVER=microvm-tcg but missing: ${missing.join(", ")}`, reasons);
    reasons.push("WARREN_DRIVER=microvm-tcg: software emulation asked for explicitly (tests only; slow)");
    return { driver: "microvm-tcg", reasons };
  }
  if (!facts.kvmDevice) reasons.push("no usable /dev/kvm");
  if (missing.length > 0) reasons.push(`missing ${missing.join(", ")}`);
  const pvmOnly =
    facts.kvmModules.includes("kvm_pvm") && !facts.kvmModules.some((m) => m === "kvm_intel" || m === "kvm_amd");
  if (pvmOnly) {
    reasons.push("KVM here is kvm_pvm (nested PVM, no VMX/SVM): stock guest kernels die there with emulation failures");
  }
  let booted = false;
  if (facts.kvmDevice && missing.length === 0 && (!pvmOnly || request === "microvm")) {
    const test = await bootTest();
    reasons.push(`KVM boot test: ${test.detail}`);
    booted = test.booted;
  } else if (facts.kvmDevice && missing.length === 0) {
    reasons.push("KVM boot test skipped (a PVM host cannot pass it; WARREN_DRIVER=microvm forces it)");
  }
  if (booted) {
    reasons.push("a guest booted under KVM within the deadline");
    return { driver: "microvm", reasons };
  }
  if (request === "microvm") throw new ProbeError("WARREN_DRIVER=microvm but KVM cannot boot a guest here", reasons);
  reasons.push("choosing namespace");
  return { driver: "namespace", reasons };
}

function onPath(binary: string): string | undefined {
  for (const dir of ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]) {
    const path = join(dir, binary);
    if (existsSync(path)) return path;
  }
  return undefined;
}

export function hostFacts(linuxDir: string): HostFacts {
  let kvmDevice = false;
  try {
    accessSync("/dev/kvm", constants.R_OK | constants.W_OK);
    kvmDevice = true;
  } catch {
    kvmDevice = false;
  }
  // /proc/modules lists loadable modules; /sys/module also has built-in ones (and exists without procfs modules).
  const fromProc = existsSync("/proc/modules")
    ? readFileSync("/proc/modules", "utf8")
        .split("\n")
        .map((line) => line.split(" ")[0] ?? "")
    : [];
  const fromSys = existsSync("/sys/module") ? readdirSync("/sys/module") : [];
  const modules = [...new Set([...fromProc, ...fromSys])].filter((name) => name.startsWith("kvm"));
  return {
    kvmDevice,
    kvmModules: modules,
    qemu: onPath("qemu-system-x86_64") !== undefined,
    guestKernel: existsSync(join(linuxDir, "boot")),
    otherVmms: ["firecracker", "cloud-hypervisor"].filter((b) => onPath(b) !== undefined),
  };
}

/**
 * Boots the initramfs in probe mode (it prints a marker and powers off) under KVM, within `deadlineMs`. The
 * result is cached per host boot (boot id) and kernel, so agent restarts do not pay for it again.
 */
export async function kvmBootTest(kernel: GuestKernel, cacheDir: string, deadlineMs = 10_000): Promise<BootTestResult> {
  const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  const cache = join(cacheDir, "probe.json");
  const key = `${bootId}:${kernel.version}:${kernel.initramfs}`;
  const cached = await readFile(cache, "utf8")
    .then((text) => JSON.parse(text) as { key: string; result: BootTestResult })
    .catch(() => undefined);
  if (cached?.key === key) return { ...cached.result, detail: `${cached.result.detail} (cached this boot)` };
  const result = await bootOnce(kernel, deadlineMs);
  await mkdir(cacheDir, { recursive: true });
  await writeFile(cache, JSON.stringify({ key, result }));
  return result;
}

function bootOnce(kernel: GuestKernel, deadlineMs: number): Promise<BootTestResult> {
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(
      "qemu-system-x86_64",
      [
        ...["-M", "microvm,x-option-roms=off,isa-serial=on,rtc=off", "-accel", "kvm", "-cpu", "host"],
        ...["-m", "128", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"],
        ...["-serial", "stdio", "-kernel", kernel.vmlinux, "-initrd", kernel.initramfs],
        ...["-append", "console=ttyS0 quiet panic=-1 warren.mode=probe"],
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let output = "";
    let done = false;
    const finish = (result: BootTestResult) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      child.kill("SIGKILL");
      resolve(result);
    };
    const timer = setTimeout(
      () => finish({ booted: false, detail: `no guest userspace within ${deadlineMs} ms` }),
      deadlineMs,
    );
    const feed = (chunk: Buffer) => {
      output = (output + chunk.toString("utf8")).slice(-4000);
      if (output.includes("WARREN-PROBE-OK")) {
        finish({ booted: true, detail: `guest userspace after ${Date.now() - started} ms` });
      }
    };
    child.stdout.on("data", feed);
    child.stderr.on("data", feed);
    child.once("error", (error) => finish({ booted: false, detail: `qemu did not start: ${error.message}` }));
    child.once("exit", (code) => {
      const last = output.trim().split("\n").slice(-2).join(" | ").slice(0, 300);
      finish({ booted: false, detail: `qemu exited (${code}) before the guest's userspace: ${last || "no output"}` });
    });
  });
}
