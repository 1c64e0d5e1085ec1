import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { copyFile, link, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { type SandboxResources, type SnapshotImage, type TemplateImage, withCurrentResourceNames } from "../driver.js";
import { exec } from "../exec.js";
import type { Accel } from "./qemu.js";
import { saveMemory } from "./qemu-migration.js";
import { withQmp } from "./qmp.js";

/**
 * Sandbox snapshots of the microvm driver (`RuntimeDriver.snapshot`), one directory each under
 * `<stateDir>/sandbox-snapshots/<snapshotId>/`: `meta.json`, `disk.qcow2` (a copy of the source's qcow2 layer, so
 * its backing file is the source's: the template snapshot's disk, or the disk of the sandbox snapshot the source
 * was created from) and, for a memory snapshot, `memory.snap` (QEMU migration stream: RAM + device state).
 *
 * Instances created from a snapshot get a qcow2 layer *over* its disk (creates stay O(1), whatever the snapshot
 * holds; ext4 here has no reflinks, so a private copy per fork would cost the snapshot's whole disk layer in time
 * and space for every fork). Their backing chain refers to the snapshot's disk by path, so `delete` only marks a
 * snapshot deleted (it leaves the list at once) and its files are removed by `sweep` once nothing refers to them:
 * no instance record (live, or on disk until reconcile removes it) and no other snapshot (a snapshot of a forked
 * instance is backed by its parent's disk). Sweeps run after every kill, delete and reconcile. A snapshot is never
 * moved while referenced (a backing path must stay valid for a later QEMU of that instance: resume from disk,
 * reboot). A snapshot imported from another node (snapshot-transfer.ts) has a standalone disk and no parent.
 */
export interface SnapshotMeta extends SnapshotImage {
  readonly vcpus: number;
  /**
   * The sandbox snapshot whose disk is this one's backing file (the source was created from it). None for an
   * imported snapshot: its disk is standalone.
   */
  readonly parent?: string;
  readonly sourceInstanceId: string;
  /** What made a memory snapshot (absent in files-only ones and in those made before it was recorded). */
  readonly vm?: VmIdentity;
}

/**
 * What restoring a memory snapshot depends on besides its files: the QEMU that loads its migration stream (the
 * microvm machine has no versioned machine types), the CPU model that comes with the accelerator, and the
 * kernel and command line the guest in it was booted with (the template snapshot's key has the same parts).
 */
export interface VmIdentity {
  /** `qemu-system-x86_64 --version`, e.g. `7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)`. */
  readonly qemu: string;
  readonly accel: Accel;
  /** The guest kernel's version. */
  readonly kernel: string;
  readonly cmdline: string;
}

/** What `captureInstance` needs of the source instance. */
export interface CaptureSource {
  /** Instance directory: `disk.qcow2`, `qmp.sock`, `memory.snap` (checkpoint), `memory.paused`. */
  readonly dir: string;
  /**
   * `frozen`: paused, and `memory.paused` holds exactly its memory (an earlier snapshot of it while paused left
   * QEMU in `postmigrate`, which cannot migrate again).
   */
  readonly state: "running" | "paused" | "frozen" | "checkpointed" | "stopped";
  readonly timeoutMs: number;
  /** Called once `memory.paused` holds a paused instance's memory (whether or not the snapshot succeeds). */
  readonly onFrozen: () => Promise<void>;
}

const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const DELETED = "DELETED";

/**
 * Writes the source's memory (if it has processes) and disk into `into`; resolves whether memory was captured.
 * A running source is stopped for the copy (QEMU drains and flushes its disk on `stop` and at migration end) and
 * continues afterwards, also on failure. Memory files are hard links where one exists already (they are written
 * once and never modified, only unlinked).
 */
export async function captureInstance(source: CaptureSource, into: string): Promise<boolean> {
  const memory = join(into, "memory.snap");
  const copyDisk = () => exec("cp", ["--sparse=always", join(source.dir, "disk.qcow2"), join(into, "disk.qcow2")]);
  switch (source.state) {
    case "stopped":
      await copyDisk();
      return false;
    case "checkpointed":
      await linkOrCopy(join(source.dir, "memory.snap"), memory);
      await copyDisk();
      return true;
    case "frozen":
      await linkOrCopy(join(source.dir, "memory.paused"), memory);
      await copyDisk();
      return true;
    case "paused":
      await withQmp(join(source.dir, "qmp.sock"), (qmp) => saveMemory(qmp, memory, source.timeoutMs));
      await linkOrCopy(memory, join(source.dir, "memory.paused"));
      await source.onFrozen();
      await copyDisk();
      return true;
    case "running":
      await withQmp(join(source.dir, "qmp.sock"), async (qmp) => {
        try {
          await saveMemory(qmp, memory, source.timeoutMs);
          await copyDisk();
        } finally {
          // From `paused` (failed migration) or `postmigrate` alike; `cont` takes the disk back first.
          await qmp.execute("cont");
        }
      });
      return true;
  }
}

async function linkOrCopy(from: string, to: string): Promise<void> {
  await link(from, to).catch(() => copyFile(from, to));
}

export class SandboxSnapshots {
  readonly root: string;
  private queue: Promise<unknown> = Promise.resolve();
  /** Snapshots being read (exports): kept, with what they are layered on, even when deleted meanwhile. */
  private readonly held = new Map<string, number>();

  /** `references`: ids of the snapshots instance disks are layered on (live records and records on disk). */
  constructor(
    stateDir: string,
    private readonly references: () => Promise<Set<string>>,
    private readonly log: Logger,
  ) {
    this.root = join(stateDir, "sandbox-snapshots");
  }

  dir(snapshotId: string): string {
    return join(this.root, snapshotId);
  }

  disk(snapshotId: string): string {
    return join(this.dir(snapshotId), "disk.qcow2");
  }

  memory(snapshotId: string): string {
    return join(this.dir(snapshotId), "memory.snap");
  }

  /** One metadata change at a time: a create registering its use of a snapshot never races its deletion. */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** The snapshot if it exists and is not deleted. */
  async read(snapshotId: string): Promise<SnapshotMeta | undefined> {
    if (!ID.test(snapshotId) || existsSync(join(this.dir(snapshotId), DELETED))) return undefined;
    return readFile(join(this.dir(snapshotId), "meta.json"), "utf8").then(
      (text) => withCurrentResourceNames(JSON.parse(text) as SnapshotMeta),
      () => undefined,
    );
  }

  /**
   * Runs `fill` on a fresh temporary directory and, if it succeeds, publishes it as `snapshotId` with the meta
   * `fill` returns; on failure nothing of the snapshot is left.
   */
  async capture(
    snapshotId: string,
    fill: (dir: string) => Promise<Omit<SnapshotMeta, "snapshotId" | "sizeBytes" | "createdAt">>,
  ): Promise<SnapshotMeta> {
    this.checkNew(snapshotId);
    const tmp = this.tmpDir(snapshotId);
    try {
      await mkdir(tmp, { recursive: true });
      return await this.publish(snapshotId, tmp, { ...(await fill(tmp)), createdAt: Date.now() });
    } catch (error) {
      await rm(tmp, { recursive: true, force: true });
      throw error;
    }
  }

  /** Throws unless `snapshotId` is a valid id no snapshot has yet. */
  checkNew(snapshotId: string): void {
    if (!ID.test(snapshotId)) throw new Error(`invalid snapshot id '${snapshotId}' (letters, digits, '_.-')`);
    if (existsSync(this.dir(snapshotId))) throw new Error(`snapshot '${snapshotId}' already exists`);
  }

  /** A new directory name under the root for work on `label` (`.tmp-*`: removed by `sweep({ tmp: true })`). */
  tmpDir(label: string): string {
    return join(this.root, `.tmp-${label}-${randomBytes(4).toString("hex")}`);
  }

  /**
   * Makes `tmp` (holding the snapshot's files) snapshot `snapshotId`: its size counted, `meta.json` written, renamed
   * into place. The caller removes `tmp` if this throws.
   */
  async publish(
    snapshotId: string,
    tmp: string,
    fields: Omit<SnapshotMeta, "snapshotId" | "sizeBytes">,
  ): Promise<SnapshotMeta> {
    let sizeBytes = 0;
    for (const name of await readdir(tmp)) sizeBytes += (await stat(join(tmp, name))).blocks * 512;
    const meta: SnapshotMeta = { snapshotId, ...fields, sizeBytes };
    await writeFile(join(tmp, "meta.json"), JSON.stringify(meta));
    await this.exclusive(async () => {
      if (existsSync(this.dir(snapshotId))) throw new Error(`snapshot '${snapshotId}' already exists`);
      await rename(tmp, this.dir(snapshotId));
    });
    return meta;
  }

  /**
   * The snapshot, its files kept (with those it is layered on) until `release` even if it is deleted meanwhile.
   * Throws if it does not exist.
   */
  hold(snapshotId: string): Promise<{ meta: SnapshotMeta; release: () => Promise<void> }> {
    return this.exclusive(async () => {
      const meta = await this.read(snapshotId);
      if (!meta) throw new Error(`snapshot '${snapshotId}' does not exist on this node`);
      this.held.set(snapshotId, (this.held.get(snapshotId) ?? 0) + 1);
      let released = false;
      const release = async () => {
        if (released) return;
        released = true;
        const left = (this.held.get(snapshotId) ?? 1) - 1;
        if (left > 0) this.held.set(snapshotId, left);
        else this.held.delete(snapshotId);
        await this.sweep();
      };
      return { meta, release };
    });
  }

  async list(): Promise<SnapshotImage[]> {
    const names = existsSync(this.root) ? await readdir(this.root) : [];
    const metas = await Promise.all(names.filter((n) => !n.startsWith(".")).map((n) => this.read(n)));
    return metas.filter((m): m is SnapshotMeta => m !== undefined).map(publicImage);
  }

  /** Marks the snapshot deleted (unlisted from now on) and removes its files unless an instance still uses them. */
  async delete(snapshotId: string): Promise<void> {
    if (!ID.test(snapshotId)) return;
    await this.exclusive(async () => {
      if (!existsSync(join(this.dir(snapshotId), "meta.json"))) {
        // A directory without meta is no snapshot (a crash between mkdir and rename leaves only `.tmp-*`).
        return;
      }
      await writeFile(join(this.dir(snapshotId), DELETED), new Date().toISOString());
      await this.sweepLocked();
    });
  }

  /** Removes deleted snapshots nothing refers to any more, and leftovers of interrupted captures (`tmp` too). */
  async sweep(options: { tmp?: boolean } = {}): Promise<void> {
    await this.exclusive(async () => {
      if (options.tmp && existsSync(this.root)) {
        for (const name of await readdir(this.root)) {
          if (name.startsWith(".tmp-")) await rm(join(this.root, name), { recursive: true, force: true });
        }
      }
      await this.sweepLocked();
    });
  }

  private async sweepLocked(): Promise<void> {
    if (!existsSync(this.root)) return;
    const instances = await this.references();
    for (;;) {
      const names = (await readdir(this.root)).filter((n) => !n.startsWith("."));
      const parents = new Set<string>();
      const deleted: string[] = [];
      for (const name of names) {
        const meta = await readFile(join(this.dir(name), "meta.json"), "utf8").then(
          (text) => withCurrentResourceNames(JSON.parse(text) as SnapshotMeta),
          () => undefined,
        );
        if (meta?.parent) parents.add(meta.parent);
        if (!meta || existsSync(join(this.dir(name), DELETED))) deleted.push(name);
      }
      const free = deleted.filter((name) => !instances.has(name) && !parents.has(name) && !this.held.has(name));
      if (free.length === 0) return;
      for (const name of free) {
        await rm(this.dir(name), { recursive: true, force: true });
        this.log.debug("sandbox snapshot removed", { snapshotId: name });
      }
    }
  }
}

/** The interface's fields only (the agent stores what it is given). */
export function publicImage(meta: SnapshotMeta): SnapshotImage {
  return {
    snapshotId: meta.snapshotId,
    driver: meta.driver,
    templateId: meta.templateId,
    templateHash: meta.templateHash,
    memory: meta.memory,
    resources: meta.resources,
    sizeBytes: meta.sizeBytes,
    createdAt: meta.createdAt,
  };
}

/** Why an instance of `template` with `resources` cannot start from this snapshot, if it cannot. */
export function startProblem(
  meta: SnapshotMeta,
  driver: string,
  template: TemplateImage,
  resources: SandboxResources,
  vcpus: number,
): string | undefined {
  const id = meta.snapshotId;
  if (meta.driver !== driver) return `snapshot '${id}' was made by the '${meta.driver}' driver, not '${driver}'`;
  if (meta.templateHash !== template.hash) {
    return `snapshot '${id}' is of template '${meta.templateId}' (${meta.templateHash}), not '${template.templateId}' (${template.hash})`;
  }
  if (!meta.memory || (meta.resources.memoryMB === resources.memoryMB && meta.vcpus === vcpus)) return undefined;
  return (
    `snapshot '${id}' holds a running guest of ${meta.resources.memoryMB} MiB and ${meta.vcpus} vCPU(s); ` +
    `it cannot start with ${resources.memoryMB} MiB and ${vcpus} vCPU(s)`
  );
}

/** Which of `captureInstance`'s cases an instance record is in. */
export function captureState(record: {
  readonly paused: boolean;
  readonly checkpointed?: boolean;
  readonly stopped?: boolean;
  readonly pausedImage?: boolean;
}): CaptureSource["state"] {
  if (record.stopped) return "stopped";
  if (record.checkpointed) return "checkpointed";
  if (record.pausedImage) return "frozen";
  return record.paused ? "paused" : "running";
}
