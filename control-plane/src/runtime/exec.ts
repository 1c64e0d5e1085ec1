import { spawn } from "node:child_process";
import { accessSync, constants } from "node:fs";
import type { Socket } from "node:net";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import { type SpawnedProcess, Spawner } from "@warren/platform/spawner";

export interface ExecResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface ExecOptions {
  readonly input?: string;
  readonly env?: Readonly<Record<string, string>>;
  /** Return the result instead of throwing when the command fails. */
  readonly allowFailure?: boolean;
  readonly timeoutMs?: number;
  /** The signal a command past `timeoutMs` gets (SIGTERM unless said). */
  readonly killSignal?: NodeJS.Signals;
  /** Called with each complete line of output (stdout and stderr), for progress reporting. */
  readonly onLine?: (line: string) => void;
}

export class ExecError extends Error {
  constructor(
    readonly command: string,
    readonly result: ExecResult,
  ) {
    super(
      `${command} exited with ${result.code}: ${result.stderr.trim().slice(-2000) || result.stdout.trim().slice(-500)}`,
    );
    this.name = "ExecError";
  }
}

/** Host environment for the tools the agent runs: a fixed PATH, nothing inherited that could leak into sandboxes. */
const TOOL_ENV: Readonly<Record<string, string>> = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  LANG: "C.UTF-8",
};

/**
 * The process-wide spawner of host tools (`warren-exec --serve`, @warren/platform/spawner), once the node agent has
 * started one: a fork from the agent copies its page tables and blocks its event loop meanwhile (6–18 ms per tool
 * on the machines Warren is measured on, ~9 tools per sandbox create and kill), from the spawner ~0.1 ms. One per
 * process because every module of the runtime runs tools through `exec`; without it (tests of single modules, a
 * spawner that died), tools are forked by this process as before.
 */
let toolSpawner: Spawner | undefined;
/** How many users (node agents in this process) hold the spawner: the last one to let go stops it. */
let toolSpawnerUsers = 0;

/**
 * Forks host tools through `warren-exec --serve` at `launcher` while the returned release has not been called (the
 * node agent, from its start to its stop). Several agents in one process (tests) share one spawner.
 */
export function useToolSpawner(launcher: string, log: Logger): () => void {
  toolSpawnerUsers++;
  if (!toolSpawner?.available) toolSpawner = Spawner.start(launcher, log);
  let released = false;
  return () => {
    if (released) return;
    released = true;
    toolSpawnerUsers--;
    if (toolSpawnerUsers > 0) return;
    // Tools it started run on to their end; later ones are forked by this process.
    toolSpawner?.close();
    toolSpawner = undefined;
  };
}

/**
 * envd's static launcher (`envd/native/warren-exec.c`, built beside envd's bundle) under a node's `envdRoot`: the
 * host tools' spawner (`--serve`) and the namespace driver's one-exec steps (`--netns-setup`, `--ready-disk`,
 * `--launch-sandbox`).
 */
export function envdLauncherPath(envdRoot: string): string {
  return join(envdRoot, "envd", "dist", "warren-exec");
}

/** Absolute paths of tools by name, looked up once in TOOL_ENV's PATH (the spawner execs a path, not a name). */
const toolPaths = new Map<string, string | undefined>();

function toolPath(command: string): string | undefined {
  if (command.includes("/")) return command;
  if (!toolPaths.has(command)) {
    const found = (TOOL_ENV.PATH as string).split(":").find((dir) => {
      try {
        accessSync(join(dir, command), constants.X_OK);
        return true;
      } catch {
        return false;
      }
    });
    toolPaths.set(command, found === undefined ? undefined : join(found, command));
  }
  return toolPaths.get(command);
}

/** Runs a host tool (ip, iptables, mount, crun, ...) to completion. */
export function exec(command: string, args: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
  const env = { ...TOOL_ENV, ...options.env };
  // A tool not found is left to spawn's own ENOENT, which callers know.
  const file = toolSpawner && !options.env?.PATH ? toolPath(command) : undefined;
  const spawned = file
    ? toolSpawner?.spawn({
        argv: [file, ...args],
        env,
        cwd: process.cwd(),
        stdin: options.input !== undefined,
        hostTool: true,
      })
    : undefined;
  if (spawned) return spawned.then((child) => collect(command, args, options, child));
  return forked(command, args, options, env);
}

/** The result of a tool the spawner started, as `forked` gives it: output, input, timeout, exit. */
function collect(
  command: string,
  args: readonly string[],
  options: ExecOptions,
  child: SpawnedProcess,
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const output = new ToolOutput(options.onLine);
    const ended = (stream: Socket, into: "stdout" | "stderr") =>
      new Promise<void>((done) => {
        stream.setEncoding("utf8").on("data", (chunk: string) => output.add(into, chunk));
        stream.once("close", () => done());
        stream.once("error", () => done());
      });
    const streams = Promise.all([ended(child.stdout, "stdout"), ended(child.stderr, "stderr")]);
    if (child.stdin) {
      child.stdin.on("error", () => undefined);
      child.stdin.end(options.input ?? "");
    }
    const timer =
      options.timeoutMs !== undefined && options.timeoutMs > 0
        ? setTimeout(() => {
            try {
              process.kill(child.pid, options.killSignal ?? "SIGTERM");
            } catch {
              // Already gone.
            }
          }, options.timeoutMs)
        : undefined;
    Promise.all([child.exited, streams]).then(([{ code, signal }]) => {
      if (timer) clearTimeout(timer);
      settle(command, args, options, { code: code ?? (signal ? 128 : 1), ...output.result() }, resolve, reject);
    }, reject);
  });
}

/** Forks the tool from this process (no spawner, or it is gone). */
function forked(
  command: string,
  args: readonly string[],
  options: ExecOptions,
  env: Readonly<Record<string, string>>,
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      env,
      stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
      timeout: options.timeoutMs,
      killSignal: options.killSignal ?? "SIGTERM",
    });
    const output = new ToolOutput(options.onLine);
    child.stdout?.setEncoding("utf8").on("data", (chunk: string) => output.add("stdout", chunk));
    child.stderr?.setEncoding("utf8").on("data", (chunk: string) => output.add("stderr", chunk));
    if (options.input !== undefined) child.stdin?.end(options.input);
    child.once("error", reject);
    child.once("close", (code, signal) => {
      settle(command, args, options, { code: code ?? (signal ? 128 : 1), ...output.result() }, resolve, reject);
    });
  });
}

function settle(
  command: string,
  args: readonly string[],
  options: ExecOptions,
  result: ExecResult,
  resolve: (result: ExecResult) => void,
  reject: (error: Error) => void,
): void {
  if (result.code !== 0 && !options.allowFailure) {
    reject(new ExecError(`${command} ${args.join(" ")}`.slice(0, 300), result));
  } else {
    resolve(result);
  }
}

/** A tool's stdout and stderr, and its complete lines as they come (ExecOptions.onLine). */
class ToolOutput {
  private stdout = "";
  private stderr = "";
  private pending = "";

  constructor(private readonly onLine: ((line: string) => void) | undefined) {}

  add(stream: "stdout" | "stderr", chunk: string): void {
    if (stream === "stdout") this.stdout += chunk;
    else this.stderr += chunk;
    if (!this.onLine) return;
    this.pending += chunk;
    let nl = this.pending.indexOf("\n");
    while (nl >= 0) {
      this.onLine(this.pending.slice(0, nl));
      this.pending = this.pending.slice(nl + 1);
      nl = this.pending.indexOf("\n");
    }
  }

  result(): { stdout: string; stderr: string } {
    return { stdout: this.stdout, stderr: this.stderr };
  }
}

/** Serialises async jobs (e.g. firewall edits, which race when run concurrently). */
export class SerialQueue {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(job: () => Promise<T>): Promise<T> {
    const next = this.tail.then(job, job);
    this.tail = next.catch(() => undefined);
    return next;
  }
}
