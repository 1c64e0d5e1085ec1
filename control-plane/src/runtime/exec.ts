import { spawn } from "node:child_process";

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

/** Runs a host tool (ip, iptables, mount, crun, ...) to completion. */
export function exec(command: string, args: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      env: { ...TOOL_ENV, ...options.env },
      stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
      timeout: options.timeoutMs,
      killSignal: options.killSignal ?? "SIGTERM",
    });
    let stdout = "";
    let stderr = "";
    let pending = "";
    const feed = (chunk: string) => {
      if (!options.onLine) return;
      pending += chunk;
      let nl = pending.indexOf("\n");
      while (nl >= 0) {
        options.onLine(pending.slice(0, nl));
        pending = pending.slice(nl + 1);
        nl = pending.indexOf("\n");
      }
    };
    child.stdout?.setEncoding("utf8").on("data", (chunk: string) => {
      stdout += chunk;
      feed(chunk);
    });
    child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
      stderr += chunk;
      feed(chunk);
    });
    if (options.input !== undefined) child.stdin?.end(options.input);
    child.once("error", reject);
    child.once("close", (code, signal) => {
      const result = { code: code ?? (signal ? 128 : 1), stdout, stderr };
      if (result.code !== 0 && !options.allowFailure) {
        reject(new ExecError(`${command} ${args.join(" ")}`.slice(0, 300), result));
      } else {
        resolve(result);
      }
    });
  });
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
