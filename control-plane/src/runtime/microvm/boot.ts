import { readFile, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { exec } from "../exec.js";
import { healthy } from "../sandbox-process.js";
import { CODE_GATEWAY_PORT, ENVD_PORT } from "./guest-image.js";
import { type Accel, killVm, launchVm, processStartTime, type VmLaunch } from "./qemu.js";

/**
 * Booting a guest and knowing when it is ready: envd's `/health`, and the code gateway's for code templates
 * (ready only when both answer, as in the namespace driver).
 */

/** The guest ports that must answer `/health` before an instance is handed out. */
export function readyPorts(codeGateway: boolean | undefined): readonly number[] {
  return codeGateway ? [ENVD_PORT, CODE_GATEWAY_PORT] : [ENVD_PORT];
}

/** Polls `/health` on every port until all answer, QEMU dies, or the deadline passes. */
export async function waitReady(
  addr: string,
  ports: readonly number[],
  timeoutMs: number,
  pid: number,
  startTime: string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const pending = new Set(ports);
  for (let attempt = 0; ; attempt++) {
    for (const port of [...pending]) if (await healthy(addr, 1000, port)) pending.delete(port);
    if (pending.size === 0) return;
    if ((await processStartTime(pid)) !== startTime) throw new Error("QEMU exited before the guest was ready");
    if (Date.now() > deadline) {
      throw new Error(`the guest did not answer on port ${[...pending].join(", ")} within ${timeoutMs} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, attempt < 50 ? 10 : 100));
  }
}

/** Waits until the guest init's marker appears in the console log past `from` (this boot's output). */
async function waitGuestInit(path: string, from: number, timeoutMs: number, pid: number, startTime: string) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    // A file shorter than `from` was cut to its end meanwhile (log-cap.ts): this boot's output is all there is.
    const text = await readFile(path).then(
      (b) => b.subarray(b.length < from ? 0 : from).toString("utf8"),
      () => "",
    );
    if (text.includes("WARREN-GUEST-INIT")) return;
    if ((await processStartTime(pid)) !== startTime) throw new Error(`QEMU exited during boot: ${text.slice(-200)}`);
    if (Date.now() > deadline) throw new Error(`the guest init did not start within ${timeoutMs} ms (boot hung)`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

export interface BootLimits {
  /** One attempt, kernel to ready (TCG needs minutes on a loaded machine). */
  readonly bootTimeoutMs: number;
  /** Kernel + initramfs until the guest init prints its marker (a healthy TCG boot here: 2–20 s). */
  readonly initTimeoutMs: number;
  readonly attempts: number;
}

export function bootLimits(accel: Accel, bootTimeoutMs?: number, attempts?: number): BootLimits {
  const boot = bootTimeoutMs ?? (accel === "kvm" ? 30_000 : 120_000);
  return {
    bootTimeoutMs: boot,
    initTimeoutMs: Math.min(boot, accel === "kvm" ? 10_000 : 45_000),
    attempts: attempts ?? (accel === "kvm" ? 3 : 4),
  };
}

export interface ColdBoot {
  /** The sandbox address the guest answers at. */
  readonly addr: string;
  readonly ports: readonly number[];
  /** Given: the disk is (re)made as a qcow2 over this raw image per attempt; absent: the disk is kept. */
  readonly base?: string;
  readonly limits: BootLimits;
  readonly log: Logger;
}

/**
 * Boots a VM from scratch with a deadline per attempt; a hung boot (TCG, RUNTIME-NOTES §3.4; see qemu.ts
 * kernelCmdline) is killed and retried, over a fresh disk layer when `base` is given.
 */
export async function coldBoot(launch: VmLaunch, boot: ColdBoot): Promise<{ pid: number; startTime: string }> {
  const { attempts, bootTimeoutMs, initTimeoutMs } = boot.limits;
  let lastError: Error | undefined;
  for (let attempt = 1; attempt <= attempts; attempt++) {
    if (boot.base) {
      await rm(launch.disk, { force: true });
      await exec("qemu-img", ["create", "-q", "-f", "qcow2", "-b", boot.base, "-F", "raw", launch.disk]);
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
      await waitGuestInit(consoleLog, consoleFrom, initTimeoutMs, pid, startTime);
      await waitReady(boot.addr, boot.ports, Math.max(1000, bootTimeoutMs - (Date.now() - started)), pid, startTime);
      boot.log.info("microVM booted", { attempt, ms: Date.now() - started, accel: launch.accel });
      return { pid, startTime };
    } catch (error) {
      lastError = error as Error;
      const console = (await readFile(consoleLog, "utf8").catch(() => "")).slice(-300);
      boot.log.warn("microVM boot failed; retrying", { attempt, error: lastError.message, console });
      await killVm(pid, startTime);
    }
  }
  throw new Error(`microVM did not boot in ${attempts} attempts: ${lastError?.message}`);
}
