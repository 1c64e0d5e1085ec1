import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { chown, mkdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { SandboxResources, TemplateImage } from "../driver.js";
import { exec } from "../exec.js";
import { withFileLock } from "../file-lock.js";
import { type BootLimits, coldBoot, readyPorts } from "./boot.js";
import {
  CODE_GATEWAY_PORT,
  ensureKernel,
  ensureRootImage,
  type GuestImageOptions,
  type GuestKernel,
} from "./guest-image.js";
import type { VmNetwork } from "./network.js";
import { type Accel, kernelCmdline, killVm, type VmLaunch, waitGone } from "./qemu.js";
import { snapshotAndQuit } from "./qemu-migration.js";

/** A template's saved VM (memory + disk) that creates restore; made with the template's default resources. */
export interface TemplateSnapshot {
  readonly dir: string;
  readonly disk: string;
  /** Device state (QEMU's migration stream, `x-ignore-shared`): small. */
  readonly memory: string;
  /**
   * Guest RAM, mapped copy-on-write by the VMs restored from it (qemu.ts `ramArgs`); absent when the snapshot was
   * made with RAM in the stream (`ramFile: false`).
   */
  readonly ram?: string;
  readonly memoryMB: number;
  readonly vcpus: number;
}

export interface TemplateSnapshotsOptions {
  readonly images: GuestImageOptions;
  readonly accel: Accel;
  readonly limits: BootLimits;
  /** Where the building VM gets its network slot. */
  readonly network: VmNetwork;
  /** Guest RAM in a file of its own (default), or in the migration stream (WARREN_MICROVM_RAM_FILE=0). */
  readonly ramFile?: boolean;
  readonly log: Logger;
}

export const SNAPSHOT_TIMEOUT_MS = 120_000;

export function vcpusOf(resources: SandboxResources): number {
  return Math.max(1, Math.ceil(resources.cpuCount));
}

/**
 * Template snapshots under `<images.dir>/snapshots/<key>` (once per template content + kernel + accelerator +
 * resources, shared by the agents of a host, file-locked), and the guest kernel they boot.
 */
export class TemplateSnapshots {
  private kernel: Promise<GuestKernel> | undefined;

  constructor(private readonly options: TemplateSnapshotsOptions) {}

  /** The guest kernel and initramfs, built once per process (a failed build is retried by the next caller). */
  guestKernel(): Promise<GuestKernel> {
    if (!this.kernel) {
      this.kernel = ensureKernel(this.options.images);
      this.kernel.catch(() => {
        this.kernel = undefined;
      });
    }
    return this.kernel;
  }

  /**
   * The template's snapshot for these resources, built once: boot, wait until the guest is ready (envd, and the
   * code gateway for code templates), save memory and disk state.
   */
  async ensure(template: TemplateImage, resources: SandboxResources): Promise<TemplateSnapshot> {
    const { accel, images } = this.options;
    const kernel = await this.guestKernel();
    const root = await ensureRootImage(images, template, resources.diskSizeMB);
    const vcpus = vcpusOf(resources);
    const cmdline = createHash("sha256").update(kernelCmdline(accel)).digest("hex").slice(0, 8);
    const ramFile = this.options.ramFile !== false;
    // `ramfile`: the snapshot's RAM is a file of its own; without it, RAM is in the stream.
    const name = `${template.templateId}-${root.key}-${kernel.version}-${cmdline}-${accel}-m${resources.memoryMB}-c${vcpus}${ramFile ? "-ramfile" : ""}`;
    const dir = join(images.dir, "snapshots", name);
    const snapshot = {
      dir,
      disk: join(dir, "disk.qcow2"),
      memory: join(dir, "memory.snap"),
      ...(ramFile ? { ram: join(dir, "ram") } : {}),
      memoryMB: resources.memoryMB,
      vcpus,
    };
    if (existsSync(join(dir, "READY"))) return snapshot;
    return withFileLock(join(images.dir, "locks", `snapshot-${template.templateId}.lock`), async () => {
      if (existsSync(join(dir, "READY"))) return snapshot;
      const log = this.options.log.child({ templateId: template.templateId, snapshot: name });
      // A short build directory: QEMU's unix sockets live in it (108-byte limit on socket paths).
      const tmp = join(images.dir, "snapshots", `.build-${process.pid}`);
      const started = Date.now();
      const slot = await this.options.network.acquire();
      try {
        await rm(tmp, { recursive: true, force: true });
        await mkdir(tmp, { recursive: true });
        const launch: VmLaunch = {
          name: `warren-snapshot-${template.templateId}`,
          dir: tmp,
          netnsPath: slot.netnsPath,
          kernel,
          disk: join(tmp, "disk.qcow2"),
          memoryMB: resources.memoryMB,
          vcpus,
          accel,
          jail: { uid: slot.qemuUid, gid: slot.qemuUid },
          ...(ramFile ? { ram: { path: join(tmp, "ram"), shared: true } } : {}),
        };
        const { pid, startTime } = await coldBoot(launch, {
          addr: slot.sandboxAddr,
          ports: readyPorts(template.codeGateway),
          base: root.path,
          limits: this.options.limits,
          log,
        });
        try {
          if (template.codeGateway) await waitKernels(slot.sandboxAddr, accel, log);
          // envd warms itself up right after listening (one `bash -l -c true`); let that finish before saving.
          await new Promise((resolve) => setTimeout(resolve, 2000));
          await snapshotAndQuit(join(tmp, "qmp.sock"), join(tmp, "memory.snap"), SNAPSHOT_TIMEOUT_MS, {
            ramInFile: ramFile,
          });
          await waitGone(pid, startTime, 10_000);
          // The RAM is in the page cache; on disk before READY says the snapshot is whole.
          if (ramFile) await exec("sync", ["--data", join(tmp, "ram")]);
          // The building QEMU's uid owned its disk (jail.ts prepareJail); every sandbox's backing file is root's.
          await chown(join(tmp, "disk.qcow2"), 0, 0);
        } finally {
          await killVm(pid, startTime);
        }
        await rm(join(tmp, "qmp.sock"), { force: true });
        await writeFile(join(tmp, "READY"), new Date().toISOString());
        await rm(dir, { recursive: true, force: true });
        await rename(tmp, dir);
        log.info("template snapshot built", {
          seconds: Math.round((Date.now() - started) / 100) / 10,
          streamMiB: Math.round((await stat(snapshot.memory)).size / 2 ** 20),
          ...(snapshot.ram ? { ramMiB: Math.round(((await stat(snapshot.ram)).blocks * 512) / 2 ** 20) } : {}),
        });
        return snapshot;
      } catch (error) {
        await rm(tmp, { recursive: true, force: true });
        throw error;
      } finally {
        await this.options.network.release(slot);
      }
    });
  }
}

/**
 * A code template's gateway starts its default kernels once it listens; the snapshot waits for them (the
 * gateway's `GET /warren/ready`), so every sandbox restored from it finds its Python kernel running instead of
 * starting one on its first execution (a second or two on KVM, tens of seconds under TCG). A kernel that does not
 * come up in time is no reason to fail the build: sandboxes then start it themselves, as before.
 */
async function waitKernels(addr: string, accel: Accel, log: Logger): Promise<void> {
  const started = Date.now();
  const deadline = started + (accel === "kvm" ? 60_000 : 300_000);
  while (Date.now() < deadline) {
    const answer = await fetch(`http://${addr}:${CODE_GATEWAY_PORT}/warren/ready`, {
      signal: AbortSignal.timeout(5000),
    }).then(
      async (res) => ({ status: res.status, body: (await res.json().catch(() => ({}))) as { kernels?: string } }),
      () => undefined,
    );
    if (answer?.status === 200) {
      log.info("code template kernels up for the snapshot", { kernels: answer.body.kernels, ms: Date.now() - started });
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  log.warn("the code template's kernels did not start in time; sandboxes start them on first use");
}
