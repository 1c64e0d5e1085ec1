import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { exec } from "../exec.js";
import { CRIU_ENV } from "./criu.js";

/**
 * Whether CRIU really checkpoints and restores on this host: `criu check` is not enough. Seen here: on a PVM guest
 * (kernel 6.18.44, AMD EPYC) CRIU 4.1.1's dump hung for ever while taking its parasite out (waiting for a hardware
 * breakpoint PVM never delivers; criu.ts CRIU_ENV now runs CRIU without breakpoints), while `criu check` says
 * "Looks good". So the node agent dumps and restores a `sleep` of its own, with deadlines and CRIU's environment,
 * before it offers the checkpoint tier; without it paused sandboxes stay in the freezer tier (memory kept) and
 * nothing hangs.
 *
 * The verdict is cached next to the CRIU wrapper (`probe.json`), keyed by the kernel's boot id, the wrapper's
 * mtime and how CRIU is run (`recipe`), so only the first agent after a boot pays (~0.3 s when CRIU works, the
 * deadline when it hangs).
 */
export interface CriuProbe {
  readonly usable: boolean;
  readonly reason: string;
  readonly bootId: string;
  readonly criuMtimeMs: number;
  /** How CRIU was run (its environment): a verdict reached another way is probed again. */
  readonly recipe: string;
}

const DEADLINE_MS = 5_000;

export function criuProbeFile(criu: string): string {
  return join(dirname(criu), "probe.json");
}

async function bootId(): Promise<string> {
  return (await readFile("/proc/sys/kernel/random/boot_id", "utf8")).trim();
}

export async function probeCriu(criu: string): Promise<CriuProbe> {
  const key = { bootId: await bootId(), criuMtimeMs: (await stat(criu)).mtimeMs, recipe: JSON.stringify(CRIU_ENV) };
  const cacheFile = criuProbeFile(criu);
  try {
    const cached = JSON.parse(await readFile(cacheFile, "utf8")) as CriuProbe;
    if (cached.bootId === key.bootId && cached.criuMtimeMs === key.criuMtimeMs && cached.recipe === key.recipe) {
      return cached;
    }
  } catch {
    // no verdict yet
  }
  const verdict = { ...key, ...(await dumpAndRestore(criu)) };
  await writeFile(cacheFile, `${JSON.stringify(verdict)}\n`).catch(() => undefined);
  return verdict;
}

async function dumpAndRestore(criu: string): Promise<{ usable: boolean; reason: string }> {
  const dir = await mkdtemp(join(tmpdir(), "warren-criu-probe-"));
  // A session leader of its own (detached), no terminal: what CRIU dumps without --shell-job.
  const sleeper = spawn("sleep", ["60"], { detached: true, stdio: "ignore" });
  const pid = sleeper.pid;
  const exited = new Promise<void>((resolve) => sleeper.once("exit", () => resolve()));
  let restoredPid: number | undefined;
  try {
    if (!pid) return { usable: false, reason: "could not start a process to checkpoint" };
    const startedAt = Date.now();
    const dump = await exec(criu, ["dump", "-t", String(pid), "-D", dir, "-o", "dump.log"], {
      allowFailure: true,
      timeoutMs: DEADLINE_MS,
      env: CRIU_ENV,
    });
    if (dump.code !== 0) {
      const hung = Date.now() - startedAt >= DEADLINE_MS;
      return {
        usable: false,
        reason: hung
          ? `criu dump of a sleep did not finish within ${DEADLINE_MS} ms`
          : `criu dump of a sleep failed (${dump.code}): ${(await lastLines(join(dir, "dump.log"))) || dump.stderr.trim()}`,
      };
    }
    await exited; // reaped, so its pid is free for the restore
    const pidFile = join(dir, "restored.pid");
    const restore = await exec(criu, ["restore", "-d", "-D", dir, "-o", "restore.log", "--pidfile", pidFile], {
      allowFailure: true,
      timeoutMs: DEADLINE_MS,
      env: CRIU_ENV,
    });
    if (restore.code !== 0) {
      return {
        usable: false,
        reason: `criu restore of a sleep failed (${restore.code}): ${(await lastLines(join(dir, "restore.log"))) || restore.stderr.trim()}`,
      };
    }
    restoredPid = Number((await readFile(pidFile, "utf8")).trim());
    return { usable: true, reason: "dumped and restored a process" };
  } finally {
    for (const target of [pid, restoredPid]) {
      if (target) {
        try {
          process.kill(target, "SIGKILL");
        } catch {
          // already gone
        }
      }
    }
    await rm(dir, { recursive: true, force: true });
  }
}

async function lastLines(path: string): Promise<string> {
  const text = await readFile(path, "utf8").catch(() => "");
  return text
    .split("\n")
    .filter((line) => line.includes("Error") && !line.includes("RLIMIT_NOFILE"))
    .slice(-3)
    .join(" | ");
}
