import { Code, ConnectError } from "@connectrpc/connect";
import { Signal } from "@warren/proto/process/process_pb";
import type { ConnectionConfig } from "./config.js";
import { approvalHeaders, type EnvdEndpoint, type EnvdRpc, userHeaders } from "./envd.js";
import { InvalidArgumentError, type OutputLostError, rpcError, SandboxError } from "./errors.js";
import {
  type CommandSecrets,
  createSecretGrant,
  LEASE_HEADER,
  type LeaseInfo,
  type LeaseOpts,
  listLeases,
  renewLease,
  SECRET_GRANT_HEADER,
} from "./harness.js";
import { type ProcessEnd, ProcessStream, type StreamResilience } from "./process-stream.js";

export interface CommandRequestOpts {
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface CommandStartOpts extends CommandRequestOpts, StreamResilience {
  background?: boolean;
  /**
   * Warren extra: an approval (from `ApprovalRequiredError.approvalId`, approved by an approver) for this command,
   * which the team's exec policy holds for review; it starts once, and only exactly as first requested.
   */
  approval?: string;
  cwd?: string;
  user?: string;
  envs?: Record<string, string>;
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  stdin?: boolean;
  /**
   * The command's lifetime in ms: when it passes, the sandbox kills the command and the call throws
   * TimeoutError. Warren's default is none (0): a command runs until it ends. (E2B's is 60 s.)
   */
  timeoutMs?: number;
  /** Warren extra: called when a resumed stream finds output the sandbox no longer held. */
  onOutputLost?: (lost: OutputLostError) => void;
  /**
   * Warren extra: team secrets this one command gets as env vars (through a one-time grant the proxy redeems); no
   * other process of the sandbox sees them, and envd masks their values as `***` in this command's output.
   */
  secrets?: CommandSecrets;
  /** Warren extra (background commands): reaped — SIGTERM, then SIGKILL — unless renewed within `ttlMs`. */
  lease?: LeaseOpts;
}

export interface CommandConnectOpts
  extends Pick<CommandStartOpts, "onStdout" | "onStderr" | "timeoutMs" | "onOutputLost">,
    CommandRequestOpts,
    StreamResilience {
  /**
   * Warren extra: replay output from this byte offset (0 = everything the sandbox still holds)
   * before live output. Default: live output only, as in E2B.
   */
  replayFrom?: number;
}

export interface CommandResult {
  exitCode: number;
  error?: string;
  stdout: string;
  stderr: string;
}

export interface ProcessInfo {
  pid: number;
  tag?: string;
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
  /** Warren extra: the process's lease, when it was started with one. */
  lease?: LeaseInfo;
}

/** Thrown by wait()/run() when a command exits with a non-zero code; carries its output. */
export class CommandExitError extends SandboxError implements CommandResult {
  constructor(private readonly result: CommandResult) {
    super(result.error);
  }
  get exitCode(): number {
    return this.result.exitCode;
  }
  get error(): string | undefined {
    return this.result.error;
  }
  get stdout(): string {
    return this.result.stdout;
  }
  get stderr(): string {
    return this.result.stderr;
  }
}

interface HandleCallbacks {
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  onPty?: (data: Uint8Array) => void | Promise<void>;
}

/**
 * A running command (or PTY): its output so far, and wait/kill/stdin/disconnect. The stream
 * behind it reconnects with replay when it drops, so `stdout` is complete and never doubled.
 */
export class CommandHandle {
  private _stdout = "";
  private _stderr = "";
  private readonly stdoutDecoder = new TextDecoder();
  private readonly stderrDecoder = new TextDecoder();
  private end: ProcessEnd | undefined;
  private readonly done: Promise<void>;
  private failure: Error | undefined;
  private disconnected = false;

  /** @internal use Commands.run/connect or Pty.create/connect */
  constructor(
    private readonly stream: ProcessStream,
    private readonly commands: Commands,
    private readonly callbacks: HandleCallbacks,
  ) {
    this.done = this.consume();
  }

  get pid(): number {
    return this.stream.pid;
  }
  get exitCode(): number | undefined {
    return this.end?.exitCode;
  }
  get error(): string | undefined {
    return this.end?.error;
  }
  get stdout(): string {
    return this._stdout;
  }
  get stderr(): string {
    return this._stderr;
  }
  /** Warren extra: offset of the next output byte (pass it as `replayFrom` to resume elsewhere). */
  get outputOffset(): number | undefined {
    return this.stream.offset;
  }
  /** Warren extra: output ranges the sandbox no longer held when this handle resumed (empty if none). */
  get lostOutput(): readonly OutputLostError[] {
    return this.stream.lost;
  }
  /** Warren extra: how many times the stream was re-established after a drop. */
  get reconnects(): number {
    return this.stream.reconnectCount;
  }

  private async consume(): Promise<void> {
    try {
      for await (const item of this.stream.events()) {
        if (this.disconnected) break;
        if (item.kind === "end") {
          this.end = item;
          break;
        }
        if (item.kind === "stdout") {
          const text = this.stdoutDecoder.decode(item.data, { stream: true });
          this._stdout += text;
          if (text) await this.callbacks.onStdout?.(text);
        } else if (item.kind === "stderr") {
          const text = this.stderrDecoder.decode(item.data, { stream: true });
          this._stderr += text;
          if (text) await this.callbacks.onStderr?.(text);
        } else {
          await this.callbacks.onPty?.(item.data);
        }
      }
      this._stdout += this.stdoutDecoder.decode();
      this._stderr += this.stderrDecoder.decode();
    } catch (error) {
      this.failure = error instanceof Error ? error : new SandboxError(String(error));
    }
  }

  /** Waits for the command to end. Throws CommandExitError on a non-zero exit code. */
  async wait(): Promise<CommandResult> {
    await this.done;
    if (this.failure) throw this.failure;
    if (!this.end) {
      throw new SandboxError(
        this.disconnected ? `disconnected from pid ${this.pid} before it ended` : "Command ended without an end event",
      );
    }
    const result: CommandResult = {
      exitCode: this.end.exitCode,
      stdout: this._stdout,
      stderr: this._stderr,
      ...(this.end.error !== undefined ? { error: this.end.error } : {}),
    };
    if (result.exitCode !== 0) throw new CommandExitError(result);
    return result;
  }

  /** Stops receiving output; the command keeps running (reattach with Commands.connect). */
  async disconnect(): Promise<void> {
    this.disconnected = true;
    this.stream.close();
  }

  /** Kills the command with SIGKILL. `false` if it was not found. */
  kill(opts?: CommandRequestOpts): Promise<boolean> {
    return this.commands.kill(this.pid, opts);
  }

  sendStdin(data: string | Uint8Array, opts?: CommandRequestOpts): Promise<void> {
    return this.commands.sendStdin(this.pid, data, opts);
  }

  closeStdin(opts?: CommandRequestOpts): Promise<void> {
    return this.commands.closeStdin(this.pid, opts);
  }
}

/** sandbox.commands: start, attach to and signal processes in the sandbox. */
export class Commands {
  /** @internal */
  constructor(
    private readonly rpc: EnvdRpc,
    private readonly endpoint: EnvdEndpoint,
    private readonly config: ConnectionConfig,
  ) {}

  async list(opts: CommandRequestOpts = {}): Promise<ProcessInfo[]> {
    try {
      const signal = this.config.signal(opts.requestTimeoutMs, opts.signal);
      const [res, leases] = await Promise.all([
        this.rpc.process.list({}, { signal }),
        listLeases(this.endpoint, signal),
      ]);
      const leaseOf = new Map(leases.map((l) => [l.pid, l]));
      return res.processes.map((p) => ({
        pid: p.pid,
        ...(p.tag !== undefined ? { tag: p.tag } : {}),
        cmd: p.config?.cmd ?? "",
        args: p.config?.args ?? [],
        envs: p.config?.envs ?? {},
        ...(p.config?.cwd !== undefined ? { cwd: p.config.cwd } : {}),
        ...(leaseOf.has(p.pid) ? { lease: leaseOf.get(p.pid) as LeaseInfo } : {}),
      }));
    } catch (error) {
      throw rpcError(error);
    }
  }

  async sendStdin(pid: number, data: string | Uint8Array, opts: CommandRequestOpts = {}): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    try {
      await this.rpc.process.sendInput(
        { process: { selector: { case: "pid", value: pid } }, input: { input: { case: "stdin", value: bytes } } },
        { signal: this.config.signal(opts.requestTimeoutMs, opts.signal) },
      );
    } catch (error) {
      throw rpcError(error);
    }
  }

  async closeStdin(pid: number, opts: CommandRequestOpts = {}): Promise<void> {
    try {
      await this.rpc.process.closeStdin(
        { process: { selector: { case: "pid", value: pid } } },
        { signal: this.config.signal(opts.requestTimeoutMs, opts.signal) },
      );
    } catch (error) {
      throw rpcError(error);
    }
  }

  async kill(pid: number, opts: CommandRequestOpts = {}): Promise<boolean> {
    try {
      await this.rpc.process.sendSignal(
        { process: { selector: { case: "pid", value: pid } }, signal: Signal.SIGKILL },
        { signal: this.config.signal(opts.requestTimeoutMs, opts.signal) },
      );
      return true;
    } catch (error) {
      if (error instanceof ConnectError && error.code === Code.NotFound) return false;
      throw rpcError(error);
    }
  }

  /** Attaches to a running command. With `replayFrom` (Warren extra) held output comes first. */
  async connect(pid: number, opts: CommandConnectOpts = {}): Promise<CommandHandle> {
    const stream = await ProcessStream.connect(this.rpc, this.endpoint, pid, {
      ...opts,
      requestTimeoutMs: opts.requestTimeoutMs ?? this.config.requestTimeoutMs,
      ...deadlineOf(opts.timeoutMs),
    });
    return new CommandHandle(stream, this, { onStdout: opts.onStdout, onStderr: opts.onStderr });
  }

  run(cmd: string, opts?: CommandStartOpts & { background?: false }): Promise<CommandResult>;
  run(cmd: string, opts: CommandStartOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string, opts?: CommandStartOpts): Promise<CommandHandle | CommandResult>;
  async run(cmd: string, opts: CommandStartOpts = {}): Promise<CommandHandle | CommandResult> {
    const handle = await this.start(cmd, opts);
    return opts.background ? handle : handle.wait();
  }

  /** Warren extra: extends a leased process's lease by `ttlMs` (default: its own) from now. */
  async renewLease(pid: number, opts: CommandRequestOpts & { ttlMs?: number } = {}): Promise<LeaseInfo> {
    return renewLease(this.endpoint, pid, opts.ttlMs, this.config.signal(opts.requestTimeoutMs, opts.signal));
  }

  private async start(cmd: string, opts: CommandStartOpts): Promise<CommandHandle> {
    const headers = { ...userHeaders(opts.user), ...approvalHeaders(opts.approval) };
    if (opts.lease !== undefined) {
      if (!opts.background) throw new InvalidArgumentError("a lease is for background commands (background: true)");
      headers[LEASE_HEADER] = String(opts.lease.ttlMs);
    }
    if (opts.secrets !== undefined) {
      headers[SECRET_GRANT_HEADER] = await createSecretGrant(
        this.config,
        this.endpoint.sandboxId,
        opts.secrets,
        opts.signal,
      );
    }
    const stream = await ProcessStream.start(
      this.rpc,
      this.endpoint,
      {
        process: { cmd: "/bin/bash", args: ["-l", "-c", cmd], envs: opts.envs ?? {}, cwd: opts.cwd },
        stdin: opts.stdin ?? false,
      },
      headers,
      {
        ...opts,
        requestTimeoutMs: opts.requestTimeoutMs ?? this.config.requestTimeoutMs,
        ...deadlineOf(opts.timeoutMs),
      },
    );
    return new CommandHandle(stream, this, { onStdout: opts.onStdout, onStderr: opts.onStderr });
  }
}

export function deadlineOf(timeoutMs: number | undefined): { deadline?: number } {
  return timeoutMs !== undefined && timeoutMs > 0 ? { deadline: Date.now() + timeoutMs } : {};
}
