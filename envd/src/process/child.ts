import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import type { Socket } from "node:net";
import type { Readable, Writable } from "node:stream";
import type { IPty } from "@lydell/node-pty";
import type { SpawnedProcess, Spawner } from "@warren/platform/spawner";
import { failedPrecondition, invalidArgument, resourceExhausted, unavailable } from "../errors.js";
import type { Logger } from "../log.js";
import { type ProcessExit, processExit } from "./exit-status.js";
import type { OutputStream } from "./output-buffer.js";
import type { SpawnPlan } from "./spawn-plan.js";

// Input a process has not read yet that envd holds before it refuses more.
const MAX_PENDING_STDIN_BYTES = 16 * 1024 * 1024;

/** What a running child reports. Calls start only after attach() and stop after exit(). */
export interface ChildEvents {
  output(stream: OutputStream, data: Buffer): void;
  /** Once, after the process ended and its output was read to the end. */
  exit(exit: ProcessExit): void;
}

/** One OS process envd started, with pipes or a pty: the only code that touches it. */
export interface ChildHandle {
  readonly pid: number;
  readonly hasPty: boolean;
  /** It joined the workload cgroup itself before it exec'd (the spawner's children do): nothing to move. */
  readonly inWorkload: boolean;
  /** True while a stdin pipe exists and has not been closed. */
  readonly stdinOpen: boolean;
  attach(events: ChildEvents): void;
  /** Writes to the stdin pipe, resolving once the bytes are handed to the kernel. */
  writeStdin(data: Uint8Array): Promise<void>;
  /** Closes the stdin pipe (EOF); closing twice is harmless. */
  closeStdin(): void;
  writePty(data: Uint8Array): void;
  resize(cols: number, rows: number): void;
  /** Sends `signal` to the process group (each child leads its own session and group). */
  signalGroup(signal: NodeJS.Signals): void;
  /** Stops reading output until resume(): a client that reads slowly holds the process back. */
  pause(): void;
  resume(): void;
}

/**
 * Starts the plan's process: detached into its own session, with pipes or a pty. Pipe processes are forked by the
 * spawner when there is one (spawner.ts), else by envd itself.
 */
export async function spawnChild(plan: SpawnPlan, log: Logger, spawner?: Spawner): Promise<ChildHandle> {
  if (plan.pty) return PtyChild.spawn(plan, plan.pty, log);
  const spawned = spawner?.spawn({ argv: [plan.file, ...plan.args], env: plan.env, cwd: plan.cwd, stdin: plan.stdin });
  if (spawned === undefined) return PipeChild.spawn(plan, log);
  try {
    return new PipeChild(spawnedPipes(await spawned), log);
  } catch (error) {
    // Not started again by envd: the spawner may have forked it before it failed, and a command must not run twice.
    throw unavailable(`failed to start command '${plan.command}': ${(error as Error).message}; retry`);
  }
}

/** Holds events until a listener attaches, so nothing from a fast process is lost. */
class EventRelay implements ChildEvents {
  private target: ChildEvents | undefined;
  private held: Array<(events: ChildEvents) => void> = [];

  attach(target: ChildEvents): void {
    if (this.target) throw new Error("child events are already attached");
    this.target = target;
    for (const deliver of this.held) deliver(target);
    this.held = [];
  }

  output(stream: OutputStream, data: Buffer): void {
    if (this.target) this.target.output(stream, data);
    else this.held.push((target) => target.output(stream, data));
  }

  exit(exit: ProcessExit): void {
    if (this.target) this.target.exit(exit);
    else this.held.push((target) => target.exit(exit));
  }
}

function signalGroup(pid: number, signal: NodeJS.Signals, leaderAlive: boolean): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // No group left; the leader alone may still be there (it changed its own group).
    if (leaderAlive) {
      try {
        process.kill(pid, signal);
      } catch {
        // Already gone.
      }
    }
  }
}

/** A pipe process however it was forked: its pid, envd's ends of its pipes, and when it ended. */
interface ProcessPipes {
  readonly pid: number;
  readonly stdin: Writable | undefined;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** When the process itself ended (its output may still be unread). */
  readonly exited: Promise<unknown>;
  /** As Node's 'close': once the process ended and its output was read to the end. */
  readonly closed: Promise<ProcessExit>;
  readonly inWorkload: boolean;
}

/** The pipes of a process envd forked itself (Node's ChildProcess). */
function nodePipes(child: ChildProcess & { pid: number }, log: Logger): ProcessPipes {
  child.on("error", (error) => log.warn("process error", { pid: child.pid, error: error.message }));
  return {
    pid: child.pid,
    stdin: child.stdin ?? undefined,
    stdout: child.stdout as Readable,
    stderr: child.stderr as Readable,
    // Not events.once: it rejects on 'error', which a live process can emit (a failed kill), and nobody awaits that.
    exited: new Promise((resolve) => child.once("exit", resolve)),
    closed: new Promise((resolve) => child.once("close", (code, signal) => resolve(processExit(code, signal)))),
    inWorkload: false,
  };
}

/** The pipes of a process the spawner forked (spawner.ts): its end comes from the spawner. */
function spawnedPipes(spawned: SpawnedProcess): ProcessPipes {
  const closed = (stream: Socket) => new Promise<void>((resolve) => stream.once("close", () => resolve()));
  const outputDone = Promise.all([closed(spawned.stdout), closed(spawned.stderr)]);
  return {
    pid: spawned.pid,
    stdin: spawned.stdin,
    stdout: spawned.stdout,
    stderr: spawned.stderr,
    exited: spawned.exited,
    closed: Promise.all([spawned.exited, outputDone]).then(([exit]) => processExit(exit.code, exit.signal)),
    inWorkload: spawned.inWorkload,
  };
}

class PipeChild implements ChildHandle {
  readonly hasPty = false;
  readonly pid: number;
  readonly inWorkload: boolean;
  private readonly relay = new EventRelay();
  private leaderAlive = true;

  constructor(
    private readonly pipes: ProcessPipes,
    log: Logger,
  ) {
    this.pid = pipes.pid;
    this.inWorkload = pipes.inWorkload;
    pipes.stdin?.on("error", (error) => log.warn("stdin write failed", { pid: this.pid, error: error.message }));
    void pipes.exited.then(() => {
      this.leaderAlive = false;
      pipes.stdin?.destroy();
    });
    void pipes.closed.then((exit) => this.relay.exit(exit));
  }

  static async spawn(plan: SpawnPlan, log: Logger): Promise<PipeChild> {
    let child: ChildProcess;
    try {
      child = spawn(plan.file, [...plan.args], {
        cwd: plan.cwd,
        env: plan.env,
        detached: true,
        stdio: [plan.stdin ? "pipe" : "ignore", "pipe", "pipe"],
      });
    } catch (error) {
      throw invalidArgument(`failed to start command '${plan.command}': ${(error as Error).message}`);
    }
    if (child.pid === undefined) {
      const [error] = (await once(child, "error")) as [Error];
      throw invalidArgument(`failed to start command '${plan.command}': ${error.message}`);
    }
    yieldToOomKiller(child.pid);
    return new PipeChild(nodePipes(child as ChildProcess & { pid: number }, log), log);
  }

  get stdinOpen(): boolean {
    const stdin = this.pipes.stdin;
    return stdin?.writable === true && !stdin.destroyed;
  }

  attach(events: ChildEvents): void {
    // Unread pipes buffer in the kernel until these listeners attach.
    this.pipes.stdout.on("data", (data: Buffer) => this.relay.output("stdout", data));
    this.pipes.stderr.on("data", (data: Buffer) => this.relay.output("stderr", data));
    this.relay.attach(events);
  }

  writeStdin(data: Uint8Array): Promise<void> {
    const stdin = this.pipes.stdin;
    if (!stdin || !this.stdinOpen) {
      return Promise.reject(failedPrecondition(`stdin not enabled or closed for process with pid ${this.pid}`));
    }
    if (stdin.writableLength > MAX_PENDING_STDIN_BYTES) {
      return Promise.reject(
        resourceExhausted(`process with pid ${this.pid} is not reading stdin; ${stdin.writableLength} bytes wait`),
      );
    }
    return new Promise((resolve, reject) => {
      stdin.write(data, (error) =>
        error ? reject(failedPrecondition(`writing stdin of pid ${this.pid} failed: ${error.message}`)) : resolve(),
      );
    });
  }

  closeStdin(): void {
    this.pipes.stdin?.end();
  }

  writePty(): void {
    throw failedPrecondition(`process with pid ${this.pid} has no pty`);
  }

  resize(): void {
    throw failedPrecondition(`tty not assigned to process with pid ${this.pid}`);
  }

  signalGroup(signal: NodeJS.Signals): void {
    signalGroup(this.pid, signal, this.leaderAlive);
  }

  pause(): void {
    this.pipes.stdout.pause();
    this.pipes.stderr.pause();
  }

  resume(): void {
    this.pipes.stdout.resume();
    this.pipes.stderr.resume();
  }
}

/**
 * node-pty, a native addon, is loaded at the first PTY: most sandboxes never open one, and loading it at start took
 * ~3 ms of envd's CPU there (every sandbox start, pools and bursts included).
 */
let nodePty: typeof import("@lydell/node-pty") | undefined;
/**
 * A CommonJS package, required rather than imported: envd's launcher runs the bundle as a script compiled from its
 * code cache, where `import()` has no module loader to resolve from.
 */
const loadNodePty = async (): Promise<typeof import("@lydell/node-pty")> => {
  nodePty ??= createRequire(import.meta.url)("@lydell/node-pty") as typeof import("@lydell/node-pty");
  return nodePty;
};

/** node-pty's terminal as it really behaves with `encoding: null`: Buffers out, Buffers in. */
type RawPty = Omit<IPty, "onData" | "write"> & {
  onData(listener: (data: Buffer) => void): void;
  write(data: Buffer): void;
  on(event: "error", listener: (error: Error) => void): void;
};

class PtyChild implements ChildHandle {
  readonly hasPty = true;
  readonly inWorkload = false;
  readonly stdinOpen = false;
  private readonly relay = new EventRelay();
  private alive = true;

  private constructor(
    private readonly term: RawPty,
    log: Logger,
  ) {
    // node-pty rethrows socket errors that nobody listens to; EIO at exit is normal.
    term.on("error", (error) => {
      if ((error as NodeJS.ErrnoException).code === "EIO") return;
      log.warn("pty error", { pid: term.pid, error: error.message });
    });
    term.onData((data) => this.relay.output("pty", data));
    term.onExit(({ exitCode, signal }) => {
      this.alive = false;
      this.relay.exit(processExit(exitCode, signal ?? null));
    });
  }

  static async spawn(plan: SpawnPlan, size: { cols: number; rows: number }, log: Logger): Promise<PtyChild> {
    const { spawn: spawnPty } = await loadNodePty();
    let term: RawPty;
    try {
      term = spawnPty(plan.file, [...plan.args], {
        name: plan.env.TERM ?? "xterm",
        cols: size.cols,
        rows: size.rows,
        cwd: plan.cwd,
        env: { ...plan.env },
        encoding: null,
      }) as unknown as RawPty;
    } catch (error) {
      throw invalidArgument(`failed to start command '${plan.command}': ${(error as Error).message}`);
    }
    yieldToOomKiller(term.pid);
    return new PtyChild(term, log);
  }

  get pid(): number {
    return this.term.pid;
  }

  attach(events: ChildEvents): void {
    this.relay.attach(events);
  }

  writeStdin(): Promise<void> {
    return Promise.reject(failedPrecondition(`process with pid ${this.pid} has a pty: send its input as pty input`));
  }

  closeStdin(): void {
    throw failedPrecondition(
      `process with pid ${this.pid} has a pty and no stdin pipe: send Ctrl-D (0x04) as pty input instead`,
    );
  }

  writePty(data: Uint8Array): void {
    this.term.write(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }

  resize(cols: number, rows: number): void {
    try {
      this.term.resize(cols, rows);
    } catch (error) {
      throw failedPrecondition(`cannot resize the pty of pid ${this.pid}: ${(error as Error).message}`);
    }
  }

  signalGroup(signal: NodeJS.Signals): void {
    signalGroup(this.pid, signal, this.alive);
  }

  pause(): void {
    this.term.pause();
  }

  resume(): void {
    this.term.resume();
  }
}

/**
 * Makes the kernel's OOM killer pick the user's processes before envd: the highest score (1000), set on the new
 * process right after it starts and inherited by everything it forks. Raising a score needs no privilege; envd (and
 * the sandbox's init) keep theirs, so a memory bomb in a sandbox kills the bomb, not the daemon that can stop it.
 */
function yieldToOomKiller(pid: number): void {
  try {
    writeFileSync(`/proc/${pid}/oom_score_adj`, "1000");
  } catch {
    // The process may already be gone, or envd may not run as root (development): nothing to protect then.
  }
}
