import { dirname } from "node:path";
import { migrationTarget } from "./jail.js";
import { INCOMING_FD, shellSafe } from "./qemu.js";
import { type QmpClient, withQmp } from "./qmp.js";

/*
 * QEMU's migration stream as Warren uses it: restoring a VM from a memory snapshot (`-incoming`), and saving a
 * running or paused VM's memory and device state to a file (template snapshots, checkpoints, sandbox snapshots).
 * Starting, stopping and measuring QEMU processes is qemu.ts's job.
 */

export async function queryStatus(qmp: QmpClient): Promise<string> {
  return (await qmp.execute<{ status: string }>("query-status")).status;
}

/**
 * After `-incoming`: waits until the memory is loaded (status leaves `inmigrate`), then resumes the vCPUs. A
 * restore over a RAM file (`ramFile`: QEMU started with `-incoming defer`) first turns `x-ignore-shared` on, as the
 * template snapshot was saved with it, then loads fd 3, and turns it off again once loaded: what this VM saves
 * later (checkpoint, sandbox snapshot) must hold all of its memory, its RAM being private.
 */
export async function finishRestore(qmpPath: string, timeoutMs: number, ramFile = false): Promise<void> {
  await withQmp(qmpPath, async (qmp) => {
    if (ramFile) {
      await setIgnoreShared(qmp, true);
      await qmp.execute("migrate-incoming", { uri: `fd:${INCOMING_FD}` });
    }
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const status = await queryStatus(qmp);
      if (status === "paused" || status === "postmigrate" || status === "prelaunch") break;
      if (status === "running") break;
      if (status !== "inmigrate") throw new Error(`restore ended in state '${status}'`);
      if (Date.now() > deadline) throw new Error(`restore did not finish within ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    if (ramFile) await setIgnoreShared(qmp, false);
    if ((await queryStatus(qmp)) !== "running") await qmp.execute("cont");
  });
}

function setIgnoreShared(qmp: QmpClient, state: boolean): Promise<unknown> {
  return qmp.execute("migrate-set-capabilities", { capabilities: [{ capability: "x-ignore-shared", state }] });
}

/**
 * Stops the vCPUs (if running) and writes guest memory and device state to `path` (RUNTIME-NOTES §3.5: raise
 * max-bandwidth first, QEMU 7.2 defaults to 32 MiB/s). QEMU stays, in state `postmigrate`: its disk is flushed and
 * released to a would-be destination (QEMU takes it back on `cont`), and QEMU 7.2 refuses a second migration from
 * that state ("Can't migrate the vm that was paused due to previous migration") until a `cont`.
 *
 * A jailed QEMU (see `jailArgs`) can write nowhere but where it is let: the agent creates `migrate.out` in its
 * chroot, owned by its uid, QEMU's `exec:` shell writes into that, and the agent moves the file to `path` and takes
 * it back (root-owned, 0600). The QMP socket lives in the VM's directory, which tells where that is.
 *
 * `ramInFile`: the VM's RAM is a shared file mapping (a template snapshot's build, see `ramArgs`), which the stream
 * leaves out; otherwise the stream holds all of the VM's memory.
 */
export async function saveMemory(
  qmp: QmpClient,
  path: string,
  timeoutMs: number,
  options: { readonly ramInFile?: boolean } = {},
): Promise<void> {
  const target = await migrationTarget(dirname(qmp.path), path);
  try {
    await qmp.execute("migrate-set-parameters", { "max-bandwidth": 100 * 1024 ** 3 });
    // Explicitly either way: the stream's format depends on it (ramArgs), whatever an earlier restore left set.
    await setIgnoreShared(qmp, options.ramInFile === true);
    await qmp.execute("stop");
    await qmp.execute("migrate", { uri: `exec:cat > ${shellSafe(target.uri)}` });
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const info = await qmp.execute<{ status?: string; "error-desc"?: string }>("query-migrate");
      if (info.status === "completed") break;
      if (info.status === "failed" || info.status === "cancelled") {
        throw new Error(`snapshot ${info.status} (into ${target.uri}): ${info["error-desc"] ?? "no detail"}`);
      }
      if (Date.now() > deadline) {
        await qmp.execute("migrate_cancel").catch(() => undefined);
        throw new Error(`snapshot did not complete within ${timeoutMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await target.finish();
  } finally {
    await target.discard();
  }
}

/**
 * `saveMemory`, then quits QEMU. The disk is left consistent with the snapshot: QEMU flushes it when migration
 * completes and nothing runs afterwards.
 */
export async function snapshotAndQuit(
  qmpPath: string,
  path: string,
  timeoutMs: number,
  options: { readonly ramInFile?: boolean } = {},
): Promise<void> {
  await withQmp(qmpPath, async (qmp) => {
    await saveMemory(qmp, path, timeoutMs, options);
    await qmp.execute("quit").catch(() => undefined);
  });
}
