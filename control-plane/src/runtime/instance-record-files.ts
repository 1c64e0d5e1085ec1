import { existsSync, rmSync } from "node:fs";
import { readdir, readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type Instance, type SandboxResources, withCurrentResourceNames } from "./driver.js";
import { ENVD_PORT } from "./sandbox-process.js";

/**
 * A driver's instance directories, `<root>/<instanceId>/`, each with the driver's record of it in `instance.json`
 * (written atomically: a crash leaves the old or the new one). Each driver has its own record type.
 */
export class InstanceRecordFiles<R extends { readonly instanceId: string }> {
  constructor(readonly root: string) {}

  /** The directory of an instance's files. */
  dir(instanceId: string): string {
    return join(this.root, instanceId);
  }

  /** Names of every instance directory, records or not. */
  async names(): Promise<string[]> {
    return existsSync(this.root) ? await readdir(this.root) : [];
  }

  /** Writes in progress (and queued) per instance. */
  private readonly writing = new Map<string, Promise<void>>();

  /**
   * Writes the record. Writes of one instance go one after another, each of the record as it is when its turn
   * comes: two steps of a create may persist at once (its labels while its egress is applied) without racing on
   * the temporary file, and the last write holds every change.
   */
  persist(record: R): Promise<void> {
    const id = record.instanceId;
    const next = (this.writing.get(id) ?? Promise.resolve()).catch(() => undefined).then(() => this.write(record));
    this.writing.set(id, next);
    next
      .finally(() => {
        if (this.writing.get(id) === next) this.writing.delete(id);
      })
      .catch(() => undefined);
    return next;
  }

  private async write(record: R): Promise<void> {
    const path = join(this.dir(record.instanceId), "instance.json");
    await writeFile(`${path}.tmp`, JSON.stringify(record));
    await rename(`${path}.tmp`, path);
  }

  /**
   * Removes the record alone: the directory is then debris of an instance that no longer exists (its reclaim is
   * under way; after a restart, reconcile removes it like any directory without a record).
   */
  async forget(instanceId: string): Promise<void> {
    // One unlink, on a kill's path: synchronous, so it does not queue behind a refill's file work in libuv's pool.
    rmSync(join(this.dir(instanceId), "instance.json"), { force: true });
  }

  /** The record, or undefined when there is none (or it names another instance). */
  async load(instanceId: string): Promise<R | undefined> {
    try {
      const record = withCurrentResourceNames(
        JSON.parse(await readFile(join(this.dir(instanceId), "instance.json"), "utf8")) as R,
      );
      return record.instanceId === instanceId ? record : undefined;
    } catch {
      return undefined;
    }
  }
}

/** What every driver's instance record holds. */
export interface CommonInstanceRecord {
  readonly instanceId: string;
  readonly templateId: string;
  readonly templateHash: string;
  readonly addr: string;
  readonly resources: SandboxResources;
  readonly createdAt: number;
  readonly labels: Record<string, string>;
  readonly paused: boolean;
  readonly stopped?: boolean;
}

/** The driver interface's view of a record (`checkpointed`: the driver's own notion of it). */
export function instanceOf(record: CommonInstanceRecord, checkpointed: boolean): Instance {
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
    checkpointed,
    stopped: record.stopped === true,
  };
}
