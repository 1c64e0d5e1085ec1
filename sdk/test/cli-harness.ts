import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The built CLI (`npx tsc --build` first). */
export const WARREN_CLI = resolve(dirname(fileURLToPath(import.meta.url)), "..", "dist", "cli", "main.js");

export interface CliRun {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** The test process's environment without any Warren/E2B settings, so only what a test passes counts. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!/^(E2B_|WARREN_)/.test(key) && key !== "DATABASE_URL" && key !== "REDIS_URL") env[key] = value;
  }
  return { ...env, ...extra };
}

/** A running `warren` child process: its output so far, a way to signal it, and its end. */
export interface CliProcess {
  readonly child: ChildProcess;
  readonly output: () => CliRun;
  readonly done: Promise<CliRun>;
}

/** Starts `warren <args>` as a child process; `input` is written to its stdin, which is then closed. */
export function startWarren(args: readonly string[], env: NodeJS.ProcessEnv, input?: string): CliProcess {
  const child = spawn(process.execPath, [WARREN_CLI, ...args], { env, stdio: ["pipe", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => {
    stdout += d;
  });
  child.stderr.setEncoding("utf8").on("data", (d: string) => {
    stderr += d;
  });
  child.stdin.end(input ?? "");
  const output = () => ({ code: child.exitCode ?? -1, stdout, stderr });
  const done = new Promise<CliRun>((resolve) =>
    child.once("close", (code, signal) => resolve({ code: code ?? (signal ? 128 : -1), stdout, stderr })),
  );
  return { child, output, done };
}

/** Runs `warren <args>` to its end: exit code and output (never rejects on exit ≠ 0). */
export async function warren(
  args: readonly string[],
  env: NodeJS.ProcessEnv,
  timeoutMs = 120_000,
  input?: string,
): Promise<CliRun> {
  const run = startWarren(args, env, input);
  const timer = setTimeout(() => run.child.kill("SIGKILL"), timeoutMs);
  try {
    return await run.done;
  } finally {
    clearTimeout(timer);
  }
}

/** Polls until `probe` returns a value. */
export async function eventually<T>(probe: () => T | undefined | Promise<T | undefined>): Promise<T> {
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Pids of a process and all its descendants (from /proc). */
export function processTree(root: number): number[] {
  const out = [root];
  for (let i = 0; i < out.length; i++) {
    const pid = out[i] as number;
    try {
      const children = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
      if (children) out.push(...children.split(/\s+/).map(Number));
    } catch {
      // gone already
    }
  }
  return out;
}

/** Alive and not a zombie. */
export function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

export const envFileOf = (dataDir: string) => join(dataDir, "env");
