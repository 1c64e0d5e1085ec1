import { CommandHandle, type CommandRequestOpts, type Commands, deadlineOf } from "./commands.js";
import type { ConnectionConfig } from "./config.js";
import { type EnvdEndpoint, type EnvdRpc, userHeaders } from "./envd.js";
import type { OutputLostError } from "./errors.js";
import { rpcError } from "./errors.js";
import { ProcessStream, type StreamResilience } from "./process-stream.js";

export interface PtyCreateOpts extends CommandRequestOpts, StreamResilience {
  cols: number;
  rows: number;
  onData: (data: Uint8Array) => void | Promise<void>;
  /** Lifetime of the terminal in ms; Warren's default is none (0). */
  timeoutMs?: number;
  user?: string;
  envs?: Record<string, string>;
  cwd?: string;
  onOutputLost?: (lost: OutputLostError) => void;
}

export interface PtyConnectOpts extends CommandRequestOpts, StreamResilience {
  onData: (data: Uint8Array) => void | Promise<void>;
  timeoutMs?: number;
  /**
   * Warren extra: replay the terminal's scrollback (what the sandbox still holds, up to 1 MiB)
   * before live output. `true` (the default) replays all of it, a number replays from that byte
   * offset, `false` gives live output only (E2B's behaviour).
   */
  scrollback?: boolean | number;
  onOutputLost?: (lost: OutputLostError) => void;
}

/** sandbox.pty: interactive terminals. A PTY is a process; its handle is a CommandHandle. */
export class Pty {
  /** @internal */
  constructor(
    private readonly rpc: EnvdRpc,
    private readonly endpoint: EnvdEndpoint,
    private readonly config: ConnectionConfig,
    private readonly commands: Commands,
  ) {}

  async create(opts: PtyCreateOpts): Promise<CommandHandle> {
    const envs = { TERM: "xterm-256color", LANG: "C.UTF-8", LC_ALL: "C.UTF-8", ...opts.envs };
    const stream = await ProcessStream.start(
      this.rpc,
      this.endpoint,
      {
        process: { cmd: "/bin/bash", args: ["-i", "-l"], envs, cwd: opts.cwd },
        pty: { size: { cols: opts.cols, rows: opts.rows } },
      },
      userHeaders(opts.user),
      {
        ...opts,
        requestTimeoutMs: opts.requestTimeoutMs ?? this.config.requestTimeoutMs,
        ...deadlineOf(opts.timeoutMs),
      },
    );
    return new CommandHandle(stream, this.commands, { onPty: opts.onData });
  }

  /** Re-attaches to a terminal; by default its scrollback is replayed first. */
  async connect(pid: number, opts: PtyConnectOpts): Promise<CommandHandle> {
    const scrollback = opts.scrollback ?? true;
    const replayFrom = scrollback === true ? 0 : scrollback === false ? undefined : scrollback;
    const stream = await ProcessStream.connect(this.rpc, this.endpoint, pid, {
      ...opts,
      requestTimeoutMs: opts.requestTimeoutMs ?? this.config.requestTimeoutMs,
      ...deadlineOf(opts.timeoutMs),
      ...(replayFrom !== undefined ? { replayFrom } : {}),
      scrollback: scrollback !== false,
    });
    return new CommandHandle(stream, this.commands, { onPty: opts.onData });
  }

  async sendInput(pid: number, data: Uint8Array, opts: CommandRequestOpts = {}): Promise<void> {
    try {
      await this.rpc.process.sendInput(
        { process: { selector: { case: "pid", value: pid } }, input: { input: { case: "pty", value: data } } },
        { signal: this.config.signal(opts.requestTimeoutMs, opts.signal) },
      );
    } catch (error) {
      throw rpcError(error);
    }
  }

  async resize(pid: number, size: { cols: number; rows: number }, opts: CommandRequestOpts = {}): Promise<void> {
    try {
      await this.rpc.process.update(
        { process: { selector: { case: "pid", value: pid } }, pty: { size } },
        { signal: this.config.signal(opts.requestTimeoutMs, opts.signal) },
      );
    } catch (error) {
      throw rpcError(error);
    }
  }

  kill(pid: number, opts: CommandRequestOpts = {}): Promise<boolean> {
    return this.commands.kill(pid, opts);
  }
}
