import { spawn } from "node:child_process";
import { chown, mkdir, open, readdir, readFile, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { exec } from "../exec.js";

/**
 * CRIU for namespace sandboxes (RUNTIME-NOTES §2.8), with what our hosts needed beyond the notes:
 * - criu runs inside the sandbox's network namespace (nsenter): that namespace is owned by the host's user
 *   namespace (so sandbox root cannot reconfigure it), which CRIU refuses to dump from the sandbox's user
 *   namespace; shared with criu it is neither checked nor dumped, and a restore joins the target's the same way
 *   (a sandbox restored into another instance gets that instance's network).
 * - `--tcp-close`: established connections come back closed (the proxy dropped them at pause anyway);
 *   listening sockets are kept. `--skip-in-flight`: a connection a listening socket has not accepted yet when the
 *   tree is dumped (a client's request racing a snapshot) is left out instead of failing the dump; its client sees
 *   a reset, as with the established ones.
 * - the sandbox's stdout/stderr (envd.log on the host) is an external file, re-attached at restore; so is the
 *   workload cgroup's descriptor that PID 1, envd and the gateway hold (instance-container.ts WORKLOAD_FD): a
 *   restore hands them the target instance's. Restored processes land in the sandbox's cgroup
 *   (`--manage-cgroups=ignore`); restored-workload.ts moves the user's back into the workload.
 * - bind mounts from the host are external mounts (`--ext-mount-map auto`), which CRIU 4 names by their host
 *   source path; the instance's own files (resolv.conf, boot id) are named by their path in the sandbox instead,
 *   so a restore into another instance maps them to that instance's files.
 * - `--freeze-cgroup`: criu seizes the tree from the frozen state, nothing runs in between; a cgroup that was
 *   frozen before the dump is frozen after it (with --leave-running too).
 */
const CRIU_COMMON = [
  "--ext-mount-map",
  "auto",
  "--enable-external-sharing",
  "--enable-external-masters",
  "--tcp-close",
  "--file-locks",
  "--manage-cgroups=ignore",
];

/**
 * CRIU's environment. `CRIU_FAULT=130` is CRIU's FI_NO_BREAKPOINTS: after a dump, CRIU takes its parasite out of
 * each task by letting it run to `rt_sigreturn`; by default it stops it there with a hardware breakpoint (a debug
 * register set through ptrace). PVM guests (this machine class's kernel, 6.18 under PVM) never deliver that
 * breakpoint: the task runs on out of the parasite and CRIU waits for ever ("Waiting for <pid> to trap"), which
 * is the hang criu-probe.ts used to catch. Without breakpoints CRIU steps the task syscall by syscall
 * (PTRACE_SYSCALL) to the same point: a few more ptrace stops per task, on every host.
 */
export const CRIU_ENV: Readonly<Record<string, string>> = { CRIU_FAULT: "130" };

/**
 * How long a dump or restore of `bytes` of memory may take before criu is killed: CRIU has been seen to hang for
 * ever inside its parasite on one host kind (criu-probe.ts), and one hung dump would hold the sandbox's queue, so
 * the sandbox could never be resumed. Generous: 30 s plus 10 s per 100 MiB (dumps run at 100+ MiB/s here).
 */
export function criuDeadlineMs(bytes: number): number {
  return 30_000 + Math.ceil(bytes / (100 * 2 ** 20)) * 10_000;
}

export interface DumpOptions {
  readonly criu: string;
  readonly netnsPath: string;
  /** The sandbox's PID 1 (host pid). */
  readonly pid: number;
  readonly imagesDir: string;
  readonly freezerDir: string;
  /** CRIU's key of envd.log, the external file PID 1's stdout/stderr point to (externalFileKey). */
  readonly logFileKey: string;
  /** CRIU's keys of the workload cgroup's descriptors the tree holds (CriuExternalFiles), when it holds them. */
  readonly workloadFileKey?: string;
  readonly workloadOomFileKey?: string;
  /** Keep the tree (frozen, as it was) after the dump: a snapshot, not a checkpoint that ends it. */
  readonly leaveRunning?: boolean;
  /** Sandbox paths of the instance's own bind-mounted files (RestoreOptions.instanceFiles maps them back). */
  readonly instanceFiles: readonly string[];
  /** criu is killed (SIGKILL) past this (criuDeadlineMs). */
  readonly deadlineMs: number;
}

/** Dumps a frozen sandbox's process tree into `imagesDir` (created; removed again on failure). */
export async function criuDump(o: DumpOptions): Promise<void> {
  await rm(o.imagesDir, { recursive: true, force: true });
  // A restore opens images with the sandbox's credentials (inside its user namespace): they must be readable by
  // the sandbox's host uids, like the rest of the instance directory (no sandbox can see host paths).
  await mkdir(o.imagesDir, { mode: 0o755 });
  const startedAt = performance.now();
  const result = await exec(
    "nsenter",
    [
      `--net=${o.netnsPath}`,
      o.criu,
      "dump",
      "-t",
      String(o.pid),
      "-D",
      o.imagesDir,
      "-o",
      "dump.log",
      ...CRIU_COMMON,
      "--freeze-cgroup",
      o.freezerDir,
      "--skip-in-flight",
      "--external",
      o.logFileKey,
      ...(o.workloadFileKey ? ["--external", o.workloadFileKey] : []),
      ...(o.workloadOomFileKey ? ["--external", o.workloadOomFileKey] : []),
      ...o.instanceFiles.flatMap((inside) => ["--ext-mount-map", `${inside}:${inside}`]),
      ...(o.leaveRunning ? ["--leave-running"] : []),
    ],
    { allowFailure: true, timeoutMs: o.deadlineMs, killSignal: "SIGKILL", env: CRIU_ENV },
  );
  if (result.code !== 0) {
    const log = await criuLog(join(o.imagesDir, "dump.log"));
    await rm(o.imagesDir, { recursive: true, force: true });
    const hung = performance.now() - startedAt >= o.deadlineMs;
    throw new Error(
      hung
        ? `criu dump did not finish within ${o.deadlineMs} ms (killed): ${log}`
        : `criu dump failed (${result.code}): ${log}`,
    );
  }
}

export interface RestoreOptions {
  readonly criu: string;
  readonly netnsPath: string;
  /** cgroup.procs files of the target instance's cgroups (the restored tree joins them). */
  readonly procsFiles: readonly string[];
  /** Read only: several instances may restore from the same images (forks of one snapshot). */
  readonly imagesDir: string;
  /** Where criu writes its log and the pid file (the target instance's). */
  readonly workDir: string;
  /** The target instance's mounted overlay root. */
  readonly rootfs: string;
  /** The target instance's envd.log, handed to the restored tree as its stdout/stderr. */
  readonly logPath: string;
  readonly logFileKey: string;
  /**
   * The dumped tree's workload descriptor (DumpOptions.workloadFileKey) and the target instance's workload
   * `cgroup.procs`, which the restore opens as host root and hands to the tree in its place.
   */
  readonly workload?: {
    readonly fileKey: string;
    readonly procsFile: string;
    /** The same for the workload's OOM count (read-only), when the dump held it. */
    readonly oom?: { readonly fileKey: string; readonly file: string };
  };
  /** Host uid of the sandbox's root: the log is reopened through /proc/self/fd with the restored tree's creds. */
  readonly uid: number;
  /** Sandbox path → host file (the target instance's resolv.conf and boot id, bind-mounted into the sandbox). */
  readonly instanceFiles: Readonly<Record<string, string>>;
  /** criu is killed (SIGKILL) past this (criuDeadlineMs). */
  readonly deadlineMs: number;
}

/**
 * Restores a dumped tree into an instance's cgroups (the launcher shell joins them first; criu and the restored
 * tree inherit them), its network namespace (nsenter) and its mounted overlay root. The restored PID 1 is
 * detached (`-d`) like crun's. Resolves with its host pid.
 */
export async function criuRestore(o: RestoreOptions): Promise<number> {
  await mkdir(o.workDir, { recursive: true, mode: 0o755 });
  const pidFile = join(o.workDir, "restored.pid");
  await rm(pidFile, { force: true });
  const logFile = await open(o.logPath, "a");
  await chown(o.logPath, o.uid, o.uid);
  const workloadFile = o.workload ? await open(o.workload.procsFile, "a").catch(() => undefined) : undefined;
  const oomFile = o.workload?.oom ? await open(o.workload.oom.file, "r").catch(() => undefined) : undefined;
  let code: number;
  let hung = false;
  try {
    code = await new Promise<number>((resolve, reject) => {
      const child = spawn(
        "sh",
        [
          "-c",
          'for f in $CGROUP_PROCS; do echo $$ > "$f"; done; exec nsenter --net="$NETNS" "$@"',
          "restore",
          o.criu,
          "restore",
          "-d",
          "-D",
          o.imagesDir,
          "-W",
          o.workDir,
          "-o",
          "restore.log",
          "--root",
          o.rootfs,
          ...Object.entries(o.instanceFiles).flatMap(([inside, host]) => ["--ext-mount-map", `${inside}:${host}`]),
          ...CRIU_COMMON,
          "--inherit-fd",
          `fd[3]:${o.logFileKey}`,
          ...(o.workload && workloadFile ? ["--inherit-fd", `fd[4]:${duplicatedFileKey(o.workload.fileKey)}`] : []),
          ...(o.workload?.oom && workloadFile && oomFile
            ? ["--inherit-fd", `fd[5]:${duplicatedFileKey(o.workload.oom.fileKey)}`]
            : []),
          "--pidfile",
          pidFile,
        ],
        {
          env: {
            PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            CGROUP_PROCS: o.procsFiles.join(" "),
            NETNS: o.netnsPath,
            ...CRIU_ENV,
          },
          stdio: [
            "ignore",
            "ignore",
            "ignore",
            logFile.fd,
            ...(workloadFile ? [workloadFile.fd, ...(oomFile ? [oomFile.fd] : [])] : []),
          ],
        },
      );
      // The launcher shell execs nsenter, which execs criu: one process to kill.
      const deadline = setTimeout(() => {
        hung = true;
        child.kill("SIGKILL");
      }, o.deadlineMs);
      child.once("error", (error) => {
        clearTimeout(deadline);
        reject(error);
      });
      child.once("exit", (exitCode) => {
        clearTimeout(deadline);
        resolve(exitCode ?? 1);
      });
    });
  } finally {
    await logFile.close();
    await workloadFile?.close();
    await oomFile?.close();
  }
  if (code !== 0) {
    const log = await criuLog(join(o.workDir, "restore.log"));
    throw new Error(
      hung
        ? `criu restore did not finish within ${o.deadlineMs} ms (killed): ${log}`
        : `criu restore failed (${code}): ${log}`,
    );
  }
  return Number((await readFile(pidFile, "utf8")).trim());
}

/**
 * CRIU's key for a host file a sandbox process holds open (`file[<mnt_id>:<inode>]`, hex), found on PID 1's
 * stdout, which the launcher pointed at `path`.
 */
export async function externalFileKey(pid: number, path: string, fd = 1): Promise<string> {
  const fdinfo = await readFile(`/proc/${pid}/fdinfo/${fd}`, "utf8");
  const mntId = Number(/^mnt_id:\s*(\d+)/m.exec(fdinfo)?.[1]);
  if (!Number.isInteger(mntId)) throw new Error(`no mnt_id for fd ${fd} of pid ${pid}`);
  const inode = (await stat(path, { bigint: true })).ino;
  return `file[${mntId.toString(16)}:${inode.toString(16)}]`;
}

/**
 * The `--inherit-fd` name under which CRIU hands the restored tree a duplicate of criu's own descriptor, instead of
 * reopening it. CRIU 4 looks an inherited file up twice (files-reg.c `open_path`): first by the file's path, which
 * for an external file is its key without the first character (`ile[23:536a]`: CRIU strips what it takes for the
 * leading slash), and dup()s the descriptor; then by the full key, which reopens `/proc/<criu>/fd/<n>` with the
 * restored tree's credentials. The workload's `cgroup.procs` must keep the credentials it was opened with (host
 * root: cgroup v1 checks a write against them, and only root may move the sandbox's `user` processes), and sandbox
 * root may not open it for writing: so a duplicate, never a reopen.
 */
export function duplicatedFileKey(fileKey: string): string {
  return fileKey.slice(1);
}

/** The host files a dumped tree holds open, re-attached to the target instance's on restore. */
export interface CriuExternalFiles {
  /** CRIU's key of the file the sandbox's stdout/stderr point to (envd.log). */
  readonly logFileKey: string;
  /** CRIU's key of the workload cgroup's descriptor (instance-container.ts WORKLOAD_FD); absent in older dumps. */
  readonly workloadFileKey?: string;
  /** CRIU's key of the workload's OOM count descriptor (WORKLOAD_OOM_FD); absent in older dumps. */
  readonly workloadOomFileKey?: string;
}

/** The external files of the tree whose PID 1 is `pid`: envd.log at `logPath`, the workload's descriptor `fd`. */
export async function criuExternalFiles(
  pid: number,
  logPath: string,
  workload: { readonly procsFile: string; readonly fd: number; readonly oomFile: string; readonly oomFd: number },
): Promise<CriuExternalFiles> {
  const logFileKey = await externalFileKey(pid, logPath);
  const workloadFileKey = await heldFileKey(pid, workload.procsFile, workload.fd);
  const workloadOomFileKey = await heldFileKey(pid, workload.oomFile, workload.oomFd);
  return {
    logFileKey,
    ...(workloadFileKey ? { workloadFileKey } : {}),
    ...(workloadOomFileKey ? { workloadOomFileKey } : {}),
  };
}

/**
 * CRIU's key of the file at `path` when `pid` holds it open as `fd`, else undefined (a sandbox started before it
 * was handed that descriptor).
 */
export async function heldFileKey(pid: number, path: string, fd: number): Promise<string | undefined> {
  const [held, file] = await Promise.all([
    stat(`/proc/${pid}/fd/${fd}`, { bigint: true }).catch(() => undefined),
    stat(path, { bigint: true }).catch(() => undefined),
  ]);
  if (!held || !file || held.ino !== file.ino || held.dev !== file.dev) return undefined;
  return externalFileKey(pid, path, fd);
}

/** The error lines of a CRIU log (without the harmless RLIMIT_NOFILE one), for error messages. */
export async function criuLog(path: string): Promise<string> {
  const text = await readFile(path, "utf8").catch(() => "");
  const errors = text
    .split("\n")
    .filter((line) => line.includes("Error") && !line.includes("RLIMIT_NOFILE"))
    .slice(-5);
  return errors.join("; ") || text.trim().split("\n").slice(-3).join("; ") || "(no log)";
}

export async function directorySize(dir: string): Promise<number> {
  let total = 0;
  for (const name of await readdir(dir)) total += (await stat(join(dir, name))).size;
  return total;
}
