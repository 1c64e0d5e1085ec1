import type { ConnectionOpts } from "../config.js";
import { Sandbox } from "../sandbox.js";
import type { SnapshotInfo } from "../snapshot-api.js";
import { CliError, ExitCode } from "./errors.js";
import { type Output, table } from "./output.js";

function snapshotView(info: SnapshotInfo) {
  return { ...info, ...(info.createdAt ? { createdAt: info.createdAt.toISOString() } : {}) };
}

/** `1.5 MiB`: a size for people. */
export function humanBytes(n: number | undefined): string {
  if (n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

function contents(info: SnapshotInfo): string {
  if (info.memory === undefined) return "";
  return info.memory ? "files, processes and memory" : "files only";
}

export async function snapshotSandbox(conn: ConnectionOpts, id: string, opts: { name?: string }, out: Output) {
  const spinner = out.spinner(`taking a snapshot of ${id}`);
  try {
    const info = await Sandbox.createSnapshot(id, { ...conn, ...(opts.name ? { name: opts.name } : {}) });
    const detail = [contents(info), info.sizeBytes === undefined ? "" : humanBytes(info.sizeBytes)].filter(Boolean);
    spinner.succeed(`snapshot ${info.snapshotId}${detail.length > 0 ? ` (${detail.join(", ")})` : ""}`);
    // The id alone on stdout, so `SNAP=$(warren sandbox snapshot ID)` works.
    out.result(snapshotView(info), () => info.snapshotId);
    return ExitCode.ok;
  } catch (error) {
    spinner.fail(`could not take a snapshot of ${id}`);
    throw error;
  }
}

export async function forkSandbox(
  conn: ConnectionOpts,
  id: string,
  opts: { count?: number; timeout?: number },
  out: Output,
): Promise<number> {
  const count = opts.count ?? 1;
  const spinner = out.spinner(`forking ${id} ${count === 1 ? "once" : `${count} times`}`);
  let results: Array<Sandbox | Error>;
  try {
    results = await Sandbox.fork(id, {
      ...conn,
      count,
      ...(opts.timeout !== undefined ? { timeoutMs: opts.timeout * 1000 } : {}),
    });
  } catch (error) {
    spinner.fail(`could not fork ${id}`);
    throw error;
  }
  const forks = results.filter((r): r is Sandbox => r instanceof Sandbox);
  const failed = results.filter((r): r is Error => !(r instanceof Sandbox));
  spinner.succeed(`forked ${id}: ${forks.length} of ${results.length} started`);
  out.result(
    results.map((r) =>
      r instanceof Sandbox ? { sandboxId: r.sandboxId } : { error: { name: r.name, message: r.message } },
    ),
    // The ids alone on stdout, one a line, so scripts can read them.
    () => forks.map((s) => s.sandboxId),
  );
  if (failed.length === 0) return ExitCode.ok;
  if (out.json) return ExitCode.failure;
  throw new CliError(
    `${failed.length} of ${results.length} forks did not start: ${failed.map((e) => e.message).join("; ")}`,
  );
}

export async function listSnapshots(conn: ConnectionOpts, opts: { sandbox?: string; name?: string }, out: Output) {
  const paginator = Sandbox.listSnapshots({
    ...conn,
    ...(opts.sandbox ? { sandboxId: opts.sandbox } : {}),
    ...(opts.name ? { name: opts.name } : {}),
  });
  const all: SnapshotInfo[] = [];
  while (paginator.hasNext) all.push(...(await paginator.nextItems()));
  out.result(all.map(snapshotView), () =>
    all.length === 0
      ? "no snapshots"
      : table([
          ["SNAPSHOT ID", "SANDBOX", "CREATED", "MEMORY", "SIZE"],
          ...all.map((s) => [
            s.snapshotId,
            s.sandboxId ?? "-",
            s.createdAt?.toISOString() ?? "-",
            s.memory === undefined ? "-" : s.memory ? "yes" : "no",
            humanBytes(s.sizeBytes),
          ]),
        ]),
  );
  return ExitCode.ok;
}

export async function deleteSnapshots(conn: ConnectionOpts, ids: string[], out: Output): Promise<number> {
  const results: { snapshotId: string; deleted: boolean }[] = [];
  for (const id of ids) results.push({ snapshotId: id, deleted: await Sandbox.deleteSnapshot(id, conn) });
  out.result(results.length === 1 ? results[0] : results, () =>
    results.map((r) => (r.deleted ? `deleted ${r.snapshotId}` : `snapshot ${r.snapshotId} not found`)),
  );
  const missing = results.filter((r) => !r.deleted).map((r) => r.snapshotId);
  if (missing.length > 0 && !out.json) {
    throw new CliError(
      `no snapshot ${missing.join(", ")}`,
      "`warren snapshot list` shows the snapshots your key can see",
      ExitCode.notFound,
    );
  }
  return missing.length > 0 ? ExitCode.notFound : ExitCode.ok;
}
