import { constants } from "node:fs";
import { access, stat } from "node:fs/promises";
import { delimiter, isAbsolute, resolve } from "node:path";
import type { ProcessConfig, StartRequest } from "@warren/proto/process/process_pb";
import { invalidArgument } from "../errors.js";
import { resolveUserPath } from "../paths.js";
import type { SandboxState } from "../state.js";
import type { SandboxUser } from "../users.js";

/** setpriv drops root to the user's uid, gid and supplementary groups, then execs the command. */
export const SETPRIV = "/usr/bin/setpriv";
/** prlimit sets the process limit (EnvdConfig.processLimit) on itself, then execs the rest. */
export const PRLIMIT = "/usr/bin/prlimit";
// A pty's window size is a pair of unsigned shorts (struct winsize).
const MAX_PTY_SIDE = 0xffff;
const DEFAULT_PTY_SIZE = { cols: 80, rows: 24 };

export interface PtySize {
  readonly cols: number;
  readonly rows: number;
}

/** Everything needed to start a StartRequest's process, checked and resolved. */
export interface SpawnPlan {
  /** The process configuration as the client sent it (List reports it back). */
  readonly config: ProcessConfig;
  /** The command as the client named it (for messages and logs). */
  readonly command: string;
  /** What envd executes: the resolved command, behind the launcher (or prlimit/setpriv) unless root runs unlimited. */
  readonly file: string;
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly cwd: string;
  readonly user: SandboxUser;
  /** Present for a pty process; a pty process has no separate stdin/stdout/stderr. */
  readonly pty: PtySize | undefined;
  /** Whether a pipe process gets a stdin pipe (otherwise its stdin is /dev/null). */
  readonly stdin: boolean;
}

/**
 * What envd executes for `argv` as `user`: root's commands without a limit directly; otherwise through the static
 * launcher when there is one (one exec), else `prlimit` then `setpriv` (`--init-groups`: the same groups the
 * launcher gets from the user's account). The limit is set before the uid changes: the user cannot raise a hard
 * limit (that needs CAP_SYS_RESOURCE on the host).
 */
function launchArgv(
  argv: readonly string[],
  user: SandboxUser,
  processLimit: number | undefined,
  execLauncher: string | undefined,
): string[] {
  if (user.uid === 0 && processLimit === undefined) return [...argv];
  if (execLauncher !== undefined) {
    const limit = processLimit === undefined ? [] : [`--nproc=${processLimit}`];
    const drop = user.uid === 0 ? [] : [`--uid=${user.uid}`, `--gid=${user.gid}`, `--groups=${user.groups.join(",")}`];
    return [execLauncher, ...limit, ...drop, "--", ...argv];
  }
  const asUser =
    user.uid === 0 ? argv : [SETPRIV, `--reuid=${user.uid}`, `--regid=${user.gid}`, "--init-groups", "--", ...argv];
  return processLimit === undefined
    ? [...asUser]
    : [PRLIMIT, `--nproc=${processLimit}:${processLimit}`, "--", ...asUser];
}

/**
 * Turns a StartRequest into a SpawnPlan, failing with invalid_argument before anything runs
 * when the command, its environment or its cwd are unusable. `envdPath` is envd's own PATH,
 * which every process starts with.
 */
export async function planSpawn(
  request: StartRequest,
  user: SandboxUser,
  state: SandboxState,
  envdPath: string,
  secretEnv: Readonly<Record<string, string>> = {},
  processLimit?: number,
  execLauncher?: string,
): Promise<SpawnPlan> {
  const config = request.process;
  if (!config) throw invalidArgument("start request must name a process (cmd, args, envs, cwd)");
  const command = config.cmd;
  if (command.trim() === "") throw invalidArgument("command must not be empty");
  if (command.includes("\0")) throw invalidArgument(`command '${printable(command)}' contains a NUL byte`);
  for (const [index, arg] of config.args.entries()) {
    if (arg.includes("\0")) throw invalidArgument(`argument ${index} of command '${command}' contains a NUL byte`);
  }
  // Secrets last: a request's own envs cannot shadow them. They live only in this plan's env, never in `config`.
  const env = { ...processEnv(user, state, config.envs, envdPath), ...secretEnv };
  // The cwd's check and the command's lookup at once: each is a hop through libuv's thread pool, and on a Start's
  // path three in a row cost more than the calls themselves. The cwd's error wins when both fail, as before.
  const cwd = workingDirectory(config.cwd, user, state);
  const [cwdChecked, found] = await Promise.allSettled([
    checkDirectory(cwd),
    findExecutable(command, env.PATH ?? "", cwd),
  ]);
  if (cwdChecked.status === "rejected") throw cwdChecked.reason;
  if (found.status === "rejected") throw found.reason;
  const argv = [found.value, ...config.args];
  const launch = launchArgv(argv, user, processLimit, execLauncher);
  return {
    config,
    command,
    file: launch[0] as string,
    args: launch.slice(1),
    env,
    cwd,
    user,
    pty: request.pty ? ptySize(request.pty.size?.cols ?? 0, request.pty.size?.rows ?? 0, true) : undefined,
    stdin: request.stdin ?? true,
  };
}

/**
 * A pty size from a request. Zero means "unset": a new pty gets 80x24, a resize must give
 * both sides.
 */
export function ptySize(cols: number, rows: number, defaultZeros: boolean): PtySize {
  if (defaultZeros) {
    cols ||= DEFAULT_PTY_SIZE.cols;
    rows ||= DEFAULT_PTY_SIZE.rows;
  }
  for (const [name, value] of [
    ["cols", cols],
    ["rows", rows],
  ] as const) {
    if (!Number.isInteger(value) || value < 1 || value > MAX_PTY_SIDE) {
      throw invalidArgument(`pty ${name} must be between 1 and ${MAX_PTY_SIDE}, got ${value}`);
    }
  }
  return { cols, rows };
}

/**
 * PATH, HOME, USER and LOGNAME of the target user, then the sandbox-wide variables, then the
 * request's own (last wins). Nothing else of envd's environment reaches the process.
 */
function processEnv(
  user: SandboxUser,
  state: SandboxState,
  requested: Readonly<Record<string, string>>,
  envdPath: string,
): Record<string, string> {
  const env: Record<string, string> = {
    PATH: envdPath,
    HOME: user.home,
    USER: user.name,
    LOGNAME: user.name,
    ...state.envVars(),
  };
  for (const [name, value] of Object.entries(requested)) {
    if (name === "" || name.includes("=") || name.includes("\0")) {
      throw invalidArgument(`invalid environment variable name '${printable(name)}'`);
    }
    if (value.includes("\0")) throw invalidArgument(`environment variable '${name}' contains a NUL byte`);
    env[name] = value;
  }
  return env;
}

/** The request's cwd (relative to the user's home), else the sandbox default, else the home. */
function workingDirectory(requested: string | undefined, user: SandboxUser, state: SandboxState): string {
  return requested ? resolveUserPath(requested, user) : resolveUserPath(state.defaultWorkdir || user.home, user);
}

async function checkDirectory(cwd: string): Promise<void> {
  let isDirectory: boolean;
  try {
    isDirectory = (await stat(cwd)).isDirectory();
  } catch {
    throw invalidArgument(`cwd '${cwd}' does not exist`);
  }
  if (!isDirectory) throw invalidArgument(`cwd '${cwd}' is not a directory`);
}

/** The file execvp would run for `command`, as Go's exec.LookPath finds it. */
async function findExecutable(command: string, path: string, cwd: string): Promise<string> {
  if (command.includes("/")) {
    const file = isAbsolute(command) ? command : resolve(cwd, command);
    const problem = await executableProblem(file);
    if (problem) throw invalidArgument(`failed to start command '${command}': ${problem}`);
    return file;
  }
  for (const dir of path.split(delimiter)) {
    const file = resolve(cwd, dir || ".", command);
    if ((await executableProblem(file)) === undefined) return file;
  }
  throw invalidArgument(`failed to start command '${command}': executable file not found in $PATH`);
}

/** Why `file` cannot be executed, or undefined; its stat and access check run at once (as the cwd's above). */
async function executableProblem(file: string): Promise<string | undefined> {
  const [stats, executable] = await Promise.allSettled([stat(file), access(file, constants.X_OK)]);
  if (stats.status === "rejected") {
    const code = (stats.reason as NodeJS.ErrnoException).code;
    return code === "ENOENT" || code === "ENOTDIR" ? "no such file or directory" : "permission denied";
  }
  if (!stats.value.isFile()) return "is a directory or not a regular file";
  return executable.status === "rejected" ? "permission denied" : undefined;
}

/** Text safe to put in an error message. */
function printable(text: string): string {
  return text.replaceAll("\0", "\\0");
}
