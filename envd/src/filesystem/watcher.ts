import { type ChildProcess, spawn } from "node:child_process";
import { type EnvdError, failedPrecondition, internal } from "../errors.js";
import {
  INOTIFY_EVENTS,
  INOTIFY_FORMAT,
  InotifyEventMapper,
  InotifyOutputParser,
  type WatchEvent,
} from "./watch-events.js";

export interface WatcherOptions {
  /** Absolute directory to watch; event paths start with it. */
  readonly path: string;
  readonly recursive: boolean;
  /** Overrides the binary (tests); defaults to inotifywait on PATH (Debian's inotify-tools). */
  readonly command?: string;
}

export interface WatcherSink {
  event(event: WatchEvent): void;
  /** The watcher died on its own; no events follow. */
  failed(error: EnvdError): void;
}

const ESTABLISHED = "Watches established.";
const STDERR_LIMIT = 8192;

/**
 * One inotifywait process watching a directory (recursively: new subdirectories join the
 * watch as they appear). `start` resolves only once inotifywait says its watches are
 * established, so a change made right after can not be missed. `close` kills the process
 * and waits for it: no watcher outlives its owner.
 */
export class DirectoryWatcher {
  private closing = false;
  private readonly exited: Promise<void>;

  private constructor(
    private readonly child: ChildProcess,
    private readonly mapper: InotifyEventMapper,
  ) {
    this.exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once("close", () => resolve());
    });
  }

  static start(options: WatcherOptions, sink: WatcherSink, signal?: AbortSignal): Promise<DirectoryWatcher> {
    const args = ["-m", "--format", INOTIFY_FORMAT, "--no-newline", "-e", INOTIFY_EVENTS];
    if (options.recursive) args.push("-r");
    args.push("--", options.path);
    const child = spawn(options.command ?? "inotifywait", args, { stdio: ["ignore", "pipe", "pipe"] });
    const mapper = new InotifyEventMapper(options.path, (event) => sink.event(event));
    const watcher = new DirectoryWatcher(child, mapper);
    const parser = new InotifyOutputParser();
    child.stdout?.on("data", (chunk: Buffer) => {
      if (watcher.closing) return;
      for (const record of parser.push(chunk)) mapper.handle(record);
    });

    let stderr = "";
    let established = false;
    return new Promise<DirectoryWatcher>((resolve, reject) => {
      const onAbort = () => {
        watcher.close().catch(() => {});
        reject(signal?.reason ?? internal("watch aborted"));
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      const settle = () => signal?.removeEventListener("abort", onAbort);

      child.stderr?.on("data", (chunk: Buffer) => {
        if (stderr.length < STDERR_LIMIT) stderr += chunk.toString("utf8");
        if (!established && stderr.includes(ESTABLISHED)) {
          established = true;
          settle();
          resolve(watcher);
        }
      });
      child.once("error", (error: NodeJS.ErrnoException) => {
        settle();
        const why = error.code === "ENOENT" ? "inotifywait is not installed (package inotify-tools)" : error.message;
        reject(internal(`cannot watch '${options.path}': ${why}`));
      });
      child.once("close", (code, exitSignal) => {
        mapper.close();
        if (!established) {
          settle();
          reject(watchFailure(options.path, stderr, code, exitSignal));
        } else if (!watcher.closing) {
          sink.failed(watchFailure(options.path, stderr, code, exitSignal));
        }
      });
    });
  }

  get running(): boolean {
    return !this.closing && this.child.exitCode === null && this.child.signalCode === null;
  }

  async close(): Promise<void> {
    this.closing = true;
    this.mapper.close();
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGKILL");
    await this.exited;
  }
}

function watchFailure(path: string, stderr: string, code: number | null, signal: NodeJS.Signals | null): EnvdError {
  const detail = stderr
    .split("\n")
    .filter((line) => line && !line.startsWith("Setting up watches") && !line.startsWith(ESTABLISHED))
    .join("; ");
  if (/upper limit on inotify (watches|instances)/i.test(detail)) {
    return failedPrecondition(`cannot watch '${path}': ${detail} (raise fs.inotify.max_user_watches/instances)`);
  }
  const how = signal ? `killed by ${signal}` : `exited with ${code}`;
  return internal(`watcher for '${path}' stopped (${how})${detail ? `: ${detail}` : ""}`);
}
