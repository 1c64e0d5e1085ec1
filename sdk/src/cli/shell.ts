import type { CommandHandle } from "../commands.js";
import { CommandExitError } from "../commands.js";
import type { ConnectionOpts } from "../config.js";
import { Sandbox } from "../sandbox.js";
import { CliError, ExitCode } from "./errors.js";

/** Ctrl-]: detaches from the terminal (it keeps running in the sandbox; `--attach <pid>` returns to it). */
const DETACH_KEY = 0x1d;

export interface ShellOptions {
  attach?: number;
  cwd?: string;
  user?: string;
}

/**
 * `warren sandbox shell ID`: an interactive terminal over the PTY API. The local terminal is in raw mode,
 * so every key (Ctrl-C included) goes to the sandbox's terminal; SIGWINCH resizes it. A dropped stream is
 * resumed by the SDK from the last byte it got; `--attach PID` re-attaches to a terminal, replaying its
 * scrollback first. Exits with the shell's exit code.
 */
export async function shell(conn: ConnectionOpts, id: string, opts: ShellOptions): Promise<number> {
  const stdin = process.stdin;
  const stdout = process.stdout;
  if (!stdin.isTTY || !stdout.isTTY) {
    throw new CliError(
      "`warren sandbox shell` needs a terminal (stdin and stdout must be TTYs)",
      "for scripts use `warren sandbox exec ID -- <command>`",
      ExitCode.usage,
    );
  }
  const sandbox = await Sandbox.connect(id, conn);
  const size = () => ({ cols: stdout.columns || 80, rows: stdout.rows || 24 });
  const onData = (data: Uint8Array) => void stdout.write(data);
  let handle: CommandHandle;
  if (opts.attach !== undefined) {
    handle = await sandbox.pty.connect(opts.attach, { onData });
    await sandbox.pty.resize(opts.attach, size());
  } else {
    handle = await sandbox.pty.create({
      ...size(),
      onData,
      ...(opts.cwd ? { cwd: opts.cwd } : {}),
      ...(opts.user ? { user: opts.user } : {}),
    });
  }
  const pid = handle.pid;

  let detached = false;
  let inputs = Promise.resolve();
  const onInput = (chunk: Buffer) => {
    const detachAt = chunk.indexOf(DETACH_KEY);
    const data = detachAt >= 0 ? chunk.subarray(0, detachAt) : chunk;
    if (data.length > 0) {
      // Keystrokes go in order, one request at a time.
      inputs = inputs.then(() => sandbox.pty.sendInput(pid, data).catch(() => undefined));
    }
    if (detachAt >= 0) {
      detached = true;
      void inputs.then(() => handle.disconnect());
    }
  };
  const onResize = () => void sandbox.pty.resize(pid, size()).catch(() => undefined);

  stdin.setRawMode(true);
  stdin.resume();
  stdin.on("data", onInput);
  process.on("SIGWINCH", onResize);
  try {
    const exitCode = await handle.wait().then(
      (result) => result.exitCode,
      (error: unknown) => {
        if (error instanceof CommandExitError) return error.exitCode;
        if (detached) return ExitCode.ok;
        throw error;
      },
    );
    if (detached) {
      process.stderr.write(`\r\nwarren: detached; re-attach with: warren sandbox shell ${id} --attach ${pid}\r\n`);
      return ExitCode.ok;
    }
    return exitCode;
  } finally {
    process.off("SIGWINCH", onResize);
    stdin.off("data", onInput);
    stdin.setRawMode(false);
    stdin.pause();
    // A paused TTY stream still holds the event loop; the terminal session is over.
    stdin.unref();
  }
}
