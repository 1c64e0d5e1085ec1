import { spawn } from "node:child_process";
import { closeSync, constants, openSync } from "node:fs";
import { Socket } from "node:net";
import { constants as osConstants } from "node:os";
import type { Readable, Writable } from "node:stream";
import type { Logger } from "./log.js";

/**
 * A spawner started before this process (`warren-exec --serve-beside`, which then exec'd it): its pid and this
 * process's ends of its stdin (requests) and stdout (replies), from WARREN_SPAWNER=<pid>:<request fd>:<reply fd>.
 */
export interface InheritedSpawner {
  readonly pid: number;
  readonly requestFd: number;
  readonly replyFd: number;
}

/** WARREN_SPAWNER's value; undefined when absent or malformed (the spawner is then started as a child). */
export function parseInheritedSpawner(value: string | undefined): InheritedSpawner | undefined {
  const match = /^(\d+):(\d+):(\d+)$/.exec(value ?? "");
  if (!match) return undefined;
  const [pid, requestFd, replyFd] = match.slice(1).map(Number) as [number, number, number];
  return pid > 0 && requestFd > 2 && replyFd > 2 && requestFd !== replyFd ? { pid, requestFd, replyFd } : undefined;
}

/** The spawner this process talks to: its pid, its stdin and stdout, and whether it still runs. */
interface SpawnerChannel {
  readonly pid: number;
  readonly requests: Writable;
  readonly replies: Readable;
  running(): boolean;
}

/** What the spawner is asked to start: its argv, environment, directory and stdin. */
export interface SpawnRequest {
  /** argv[0] is the file; when it is the launcher itself, the spawner's child applies its options in-process. */
  readonly argv: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  readonly cwd: string;
  readonly stdin: boolean;
  /**
   * A host tool of the node agent (ip, iptables, crun, ...): it keeps the spawner's OOM score instead of taking the
   * top one a sandbox's command gets (what a tool starts, a sandbox's init among them, inherits it).
   */
  readonly hostTool?: boolean;
}

/** A command the spawner started: its pipes (envd's own ends) and its end. */
export interface SpawnedProcess {
  readonly pid: number;
  readonly stdin: Socket | undefined;
  readonly stdout: Socket;
  readonly stderr: Socket;
  /** Its wait status decoded; both null when the spawner died before telling (an unknown exit: "exit status -1"). */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /**
   * It joined the sandbox's workload cgroup itself before it exec'd (a spawner given `--workload-fd`): nothing is
   * left for its user to move.
   */
  readonly inWorkload: boolean;
}

interface PendingSpawn {
  resolve(process: SpawnedProcess): void;
  reject(error: Error): void;
}

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(
  Object.entries(osConstants.signals).map(([name, number]) => [number, name as NodeJS.Signals]),
);

/** A wait status (`waitpid`) as Node reports a child's end: an exit code, or the signal that ended it. */
export function decodeWaitStatus(status: number): { code: number | null; signal: NodeJS.Signals | null } {
  const signal = status & 0x7f;
  if (signal === 0) return { code: (status >> 8) & 0xff, signal: null };
  return { code: null, signal: SIGNAL_NAMES.get(signal) ?? null };
}

/**
 * A Node.js process's side of `warren-exec --serve` (envd/native/warren-exec.c): one small process that forks every
 * command, since a fork from a Node.js process copies its page tables and blocks its event loop meanwhile (~3 ms per
 * command from envd, 6–18 ms from the node agent, on the machines Warren is measured on; ~0.1 ms from the spawner).
 * envd starts sandboxes' commands through it, the node agent its host tools (runtime/exec.ts). Requests and replies
 * are the framed fields and lines that file documents; a started command's pipes are opened through
 * `/proc/<spawner>/fd`, then the spawner closes its copies. The spawner is its user's child, in its cgroup; a spawner
 * given the sandbox's workload cgroup has each command join it before it execs (`inWorkload`), else envd moves the
 * commands into it after they started (ProcessOptions.onSpawn).
 *
 * When the spawner is gone (it died, or could not start), `spawn` answers undefined and the caller forks commands
 * itself; commands it had started run on, and end with an unknown exit once their output closes. A start the
 * spawner did not answer before it died fails (it may have forked the command already: starting it again could run
 * it twice).
 */
export class Spawner {
  private channel: SpawnerChannel | undefined;
  private nextId = 1;
  private readonly pending = new Map<string, PendingSpawn>();
  private readonly exits = new Map<number, (exit: { code: number | null; signal: NodeJS.Signals | null }) => void>();
  private buffered = "";

  private constructor(
    private readonly launcher: string,
    private readonly log: Logger,
  ) {}

  /**
   * Starts the spawner beside its user (when it cannot run, it is logged and `spawn` answers undefined), or adopts
   * the one `inherited` names.
   */
  static start(launcher: string, log: Logger, inherited?: InheritedSpawner): Spawner {
    const spawner = new Spawner(launcher, log);
    if (!inherited || !spawner.adoptInherited(inherited)) spawner.launch();
    return spawner;
  }

  get available(): boolean {
    return this.channel?.running() === true;
  }

  /** Starts `request`'s process; undefined when the spawner is not there (the caller then forks it itself). */
  spawn(request: SpawnRequest): Promise<SpawnedProcess> | undefined {
    const channel = this.channel;
    if (!channel?.running() || !channel.requests.writable) return undefined;
    const id = String(this.nextId++);
    const fields = [
      "spawn",
      id,
      request.stdin ? "pipe" : "null",
      request.hostTool ? "host" : request.argv[0] === this.launcher ? "launch" : "exec",
      request.cwd,
      String(request.argv.length),
      ...request.argv,
      String(Object.keys(request.env).length),
      ...Object.entries(request.env).map(([name, value]) => `${name}=${value}`),
    ];
    return new Promise<SpawnedProcess>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      channel.requests.write(frame(fields));
    });
  }

  close(): void {
    this.channel?.requests.end();
  }

  private launch(): void {
    const child = spawn(this.launcher, ["--serve"], { stdio: ["pipe", "pipe", "inherit"] });
    child.on("error", (error) => this.log.warn("the command spawner failed", { error: error.message }));
    if (child.pid === undefined || !child.stdin || !child.stdout) return;
    const channel: SpawnerChannel = {
      pid: child.pid,
      requests: child.stdin,
      replies: child.stdout,
      running: () => child.exitCode === null && child.signalCode === null,
    };
    this.attach(channel);
    child.once("exit", (code, signal) => this.ended(channel, { code, signal }));
  }

  /** Talks to the spawner `inherited` names; false when its descriptors cannot be opened (none then). */
  private adoptInherited(inherited: InheritedSpawner): boolean {
    let requests: Socket | undefined;
    try {
      requests = new Socket({ fd: inherited.requestFd, readable: false, writable: true });
      const replies = new Socket({ fd: inherited.replyFd, readable: true, writable: false });
      let open = true;
      const channel: SpawnerChannel = { pid: inherited.pid, requests, replies, running: () => open };
      this.attach(channel);
      // Its stdout closes when it ends (it is this process's child, but Node.js reaps only the children it spawned).
      replies.once("close", () => {
        open = false;
        this.ended(channel, {});
      });
      return true;
    } catch (error) {
      requests?.destroy();
      this.log.warn("the inherited command spawner could not be used", { error: (error as Error).message });
      return false;
    }
  }

  private attach(channel: SpawnerChannel): void {
    this.channel = channel;
    channel.requests.on("error", () => undefined);
    channel.replies.on("error", () => undefined);
    channel.replies.setEncoding("latin1");
    channel.replies.on("data", (text: string) => this.read(text));
  }

  private ended(channel: SpawnerChannel, how: { code?: number | null; signal?: NodeJS.Signals | null }): void {
    if (this.channel !== channel) return;
    this.channel = undefined;
    this.log.warn("the command spawner ended; commands are forked without it", how);
    const gone = new Error("the command spawner ended");
    for (const pending of this.pending.values()) pending.reject(gone);
    this.pending.clear();
    for (const exit of this.exits.values()) exit({ code: null, signal: null });
    this.exits.clear();
  }

  private read(text: string): void {
    this.buffered += text;
    for (let newline = this.buffered.indexOf("\n"); newline >= 0; newline = this.buffered.indexOf("\n")) {
      const line = this.buffered.slice(0, newline);
      this.buffered = this.buffered.slice(newline + 1);
      this.onLine(line.split(" "));
    }
  }

  private onLine([kind, ...rest]: string[]): void {
    if (kind === "X") {
      const [pid, status] = rest.map(Number) as [number, number];
      const exit = this.exits.get(pid);
      this.exits.delete(pid);
      exit?.(decodeWaitStatus(status));
      return;
    }
    const [id, ...numbers] = rest;
    const pending = this.pending.get(id ?? "");
    if (!pending || id === undefined) return;
    this.pending.delete(id);
    if (kind === "E") {
      const errno = Number(numbers[0]);
      const name = Object.entries(osConstants.errno).find(([, n]) => n === errno)?.[0] ?? `errno ${errno}`;
      pending.reject(Object.assign(new Error(`the command spawner could not start it: ${name}`), { code: name }));
      return;
    }
    const [pid, stdinFd, stdoutFd, stderrFd, inWorkload] = numbers.map(Number) as [
      number,
      number,
      number,
      number,
      number | undefined,
    ];
    try {
      pending.resolve(this.adopt(id, pid, stdinFd, stdoutFd, stderrFd, inWorkload === 1));
    } catch (error) {
      pending.reject(error as Error);
    }
  }

  /** Opens this process's own ends of the command's pipes, then lets the spawner close its copies. */
  private adopt(
    id: string,
    pid: number,
    stdinFd: number,
    stdoutFd: number,
    stderrFd: number,
    inWorkload: boolean,
  ): SpawnedProcess {
    const spawnerPid = this.channel?.pid;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      this.exits.set(pid, resolve),
    );
    const opened: Socket[] = [];
    try {
      const path = (fd: number) => `/proc/${spawnerPid}/fd/${fd}`;
      // O_NONBLOCK: opening a pipe's read end through /proc is a FIFO open, which would wait for a writer the
      // command may already have closed; the write end of a command that already ended has no reader (ENXIO).
      const stdout = readEnd(openSync(path(stdoutFd), constants.O_RDONLY | constants.O_NONBLOCK));
      opened.push(stdout);
      const stderr = readEnd(openSync(path(stderrFd), constants.O_RDONLY | constants.O_NONBLOCK));
      opened.push(stderr);
      let stdin: Socket | undefined;
      if (stdinFd >= 0) {
        try {
          const fd = openSync(path(stdinFd), constants.O_WRONLY | constants.O_NONBLOCK);
          stdin = new Socket({ fd, readable: false, writable: true });
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== "ENXIO") throw error;
          stdin = undefined;
        }
      }
      return { pid, stdin, stdout, stderr, exited, inWorkload };
    } catch (error) {
      // A command nobody can read or end would run on unseen: it goes, with the pipe ends already opened.
      for (const socket of opened) socket.destroy();
      this.exits.delete(pid);
      try {
        process.kill(-pid, "SIGKILL");
      } catch {
        // Already gone.
      }
      throw error;
    } finally {
      this.channel?.requests.write(frame(["close", id]));
    }
  }
}

function readEnd(fd: number): Socket {
  try {
    return new Socket({ fd, readable: true, writable: false });
  } catch (error) {
    closeSync(fd);
    throw error;
  }
}

/** One request: a 32-bit little-endian length, then NUL-terminated fields. */
function frame(fields: readonly string[]): Buffer {
  const body = Buffer.from(`${fields.join("\0")}\0`, "utf8");
  const head = Buffer.alloc(4);
  head.writeUInt32LE(body.length);
  return Buffer.concat([head, body]);
}
