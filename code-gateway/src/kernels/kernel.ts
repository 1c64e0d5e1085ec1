import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import * as zmq from "zeromq";
import {
  type ConnectionInfo,
  type Content,
  endpoint,
  type JupyterMessage,
  SerialSender,
  WireCodec,
} from "../jupyter/wire.js";
import type { Logger } from "../log.js";

/** How to start one kernel process. `argv` may contain `{connection_file}`. */
export interface KernelLaunch {
  readonly language: string;
  readonly argv: readonly string[];
  readonly cwd: string;
  readonly env: Readonly<Record<string, string>>;
  /**
   * RLIMIT_NPROC of the kernel and all it forks (GatewayConfig.processLimit): kernels run as sandbox root, whose
   * process count includes envd's, so a fork bomb in a cell stops short of the sandbox's pids limit and envd can
   * still start commands and signal it.
   */
  readonly processLimit?: number;
  /** Called with the kernel's pid as soon as it exists (it joins the workload cgroup). */
  readonly onSpawn?: (pid: number) => void;
  /** Run silently once the kernel answers, before it counts as started (languages.ts warmUpCode). */
  readonly warmUpCode?: string;
}

/** Thrown into every pending request when the kernel process exits on its own. */
export class KernelDiedError extends Error {
  constructor(
    readonly exitDescription: string,
    /** True when the gateway stopped the kernel itself (restart, removal, shutdown). */
    readonly stopped: boolean,
  ) {
    super(stopped ? `kernel was stopped (${exitDescription})` : `kernel exited unexpectedly (${exitDescription})`);
    this.name = "KernelDiedError";
  }
}

interface Pending {
  onIopub(message: JupyterMessage): void;
  onReply(message: JupyterMessage): void;
  onDeath(error: KernelDiedError): void;
}

export interface ExecuteOptions {
  /** Silent executions (env setup) publish no execute_input/result and do not count. */
  readonly silent?: boolean;
  /** Every iopub message of this execution except status, in order. */
  readonly onOutput?: (message: JupyterMessage) => void;
}

/** How long a kernel start may take (GatewayConfig.kernelStartTimeoutMs, kernelStartCeilingMs). */
export interface KernelStartLimits {
  /** A start that has not answered by now fails, unless its process is still using CPU. */
  readonly timeoutMs: number;
  /** A start that is still using CPU fails here at the latest. */
  readonly ceilingMs: number;
}

/** Past the timeout, how often a start is asked whether its process used CPU lately. */
const PROGRESS_WINDOW_MS = 2500;
/** The share of one core a slow start must have used in a window to count as making progress. */
const MIN_PROGRESS_CPU_SHARE = 0.02;
/** The longest a kernel's start waits for its warm-up execution (KernelLaunch.warmUpCode). */
const WARM_UP_LIMIT_MS = 10_000;
/** /proc's CPU times are in clock ticks: 100 a second on Linux (USER_HZ). */
const TICK_MS = 10;

/** The CPU time `pid` has used (user + system, in ms), or undefined once it is gone. */
async function cpuMs(pid: number | undefined): Promise<number | undefined> {
  if (pid === undefined) return undefined;
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => undefined);
  // The command name, in parentheses, may itself hold spaces and parentheses: count fields after the last one.
  const fields = stat?.slice(stat.lastIndexOf(")") + 2).split(" ");
  if (!fields) return undefined;
  return (Number(fields[11]) + Number(fields[12])) * TICK_MS;
}

let kernelSerial = 0;

/**
 * One kernel process and the gateway's client side of its Jupyter channels (shell, iopub,
 * control over ZeroMQ IPC sockets in a private directory). The process is its own session
 * leader and gets SIGKILL if the gateway dies (setpriv --pdeathsig), so kernels never outlive it.
 */
export class Kernel {
  private readonly pending = new Map<string, Pending>();
  private readonly shell = new zmq.Dealer({ linger: 0 });
  private readonly control = new zmq.Dealer({ linger: 0 });
  private readonly iopub = new zmq.Subscriber({ linger: 0 });
  private readonly shellOut = new SerialSender(this.shell);
  private readonly controlOut = new SerialSender(this.control);
  private readonly codec: WireCodec;
  private stopping = false;
  private exited: Promise<void>;
  /** Set once the process is gone; a reason when it died on its own. */
  death: KernelDiedError | undefined;
  onDeath: ((error: KernelDiedError) => void) | undefined;

  private constructor(
    readonly language: string,
    private readonly child: ChildProcess,
    private readonly dir: string,
    info: ConnectionInfo,
    private readonly log: Logger,
  ) {
    this.codec = new WireCodec(info.key);
    // A spawn failure emits "error" and may never emit "exit".
    this.exited = new Promise((resolve) => {
      child.once("exit", () => resolve());
      child.once("error", () => resolve());
    });
    child.once("exit", (code, signal) => {
      const description = signal ? `signal ${signal}` : `exit code ${code}`;
      const death = new KernelDiedError(description, this.stopping);
      this.death = death;
      this.closeSockets();
      for (const pending of [...this.pending.values()]) pending.onDeath(death);
      this.pending.clear();
      if (this.stopping) return;
      this.log.error("kernel exited unexpectedly", { language, kernelPid: child.pid, exit: description });
      this.onDeath?.(death);
    });
    this.shell.connect(endpoint(info, "shell"));
    this.control.connect(endpoint(info, "control"));
    this.iopub.connect(endpoint(info, "iopub"));
    this.iopub.subscribe();
    void this.readLoop(this.shell, (m, p) => p.onReply(m));
    void this.readLoop(this.iopub, (m, p) => p.onIopub(m));
    void this.readLoop(this.control, () => {});
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  /** Starts the process and resolves once the kernel answers on shell and publishes on iopub. */
  static async start(
    launch: KernelLaunch,
    runtimeDir: string,
    limits: KernelStartLimits,
    log: Logger,
  ): Promise<Kernel> {
    kernelSerial += 1;
    // Unix socket paths are limited to 107 bytes: keep the directory name short.
    const dir = join(runtimeDir, `k${kernelSerial}-${randomBytes(3).toString("hex")}`);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const info: ConnectionInfo = {
      transport: "ipc",
      ip: join(dir, "s"),
      shell_port: 1,
      iopub_port: 2,
      stdin_port: 3,
      control_port: 4,
      hb_port: 5,
      key: randomUUID(),
      signature_scheme: "hmac-sha256",
      kernel_name: launch.language,
    };
    const connectionFile = join(dir, "connection.json");
    await writeFile(connectionFile, JSON.stringify(info), { mode: 0o600 });
    const argv = launch.argv.map((a) => a.replaceAll("{connection_file}", connectionFile));
    // The kernel runs the user's code: under memory pressure the OOM killer picks it (score 1000, set before it
    // starts, inherited by what it forks) before the gateway and envd, which keep theirs; the gateway restarts it.
    // Set before the kernel runs: root in a sandbox cannot raise a hard limit (CAP_SYS_RESOURCE is the host's).
    const limit = launch.processLimit === undefined ? [] : ["prlimit", `--nproc=${launch.processLimit}`, "--"];
    const [command, ...args] = [...limit, "setpriv", "--pdeathsig", "KILL", "--", "choom", "-n", "1000", "--", ...argv];
    const child = spawn(command as string, args, {
      cwd: launch.cwd,
      env: launch.env,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    if (child.pid !== undefined) launch.onSpawn?.(child.pid);
    const spawnError = new Promise<never>((_, reject) => child.once("error", reject));
    spawnError.catch(() => undefined);
    forwardLines(child, launch.language, log);
    const kernel = new Kernel(launch.language, child, dir, info, log);
    try {
      await Promise.race([kernel.waitReady(limits), spawnError]);
    } catch (error) {
      await kernel.shutdown();
      throw error;
    }
    // Best effort, and bounded: a kernel that cannot run it shows that on the first execution anyway.
    if (launch.warmUpCode) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        kernel.execute(launch.warmUpCode, { silent: true }).catch(() => undefined),
        new Promise((resolve) => {
          timer = setTimeout(resolve, WARM_UP_LIMIT_MS);
        }),
      ]);
      clearTimeout(timer);
    }
    log.info("kernel started", { language: launch.language, kernelPid: child.pid, cwd: launch.cwd });
    return kernel;
  }

  /**
   * Past `timeoutMs`, a start goes on while its process keeps using CPU: on a busy node (a pool's sandboxes start
   * in a background CPU class, and a 2-CPU host may run many starts at once) importing a kernel's libraries can take
   * far longer than usual, and failing it then only starts the same work again. A kernel that is stuck (no CPU
   * used for a window) fails at the timeout as before.
   */
  private async waitReady({ timeoutMs, ceilingMs }: KernelStartLimits): Promise<void> {
    const started = Date.now();
    const ceiling = started + Math.max(ceilingMs, timeoutMs);
    let deadline = started + timeoutMs;
    let sample: { at: number; cpuMs: number | undefined } | undefined;
    let reason = "";
    for (;;) {
      if (Date.now() >= deadline) {
        const now = Date.now();
        const used = await cpuMs(this.child.pid);
        if (sample !== undefined) {
          const progressed =
            used !== undefined &&
            sample.cpuMs !== undefined &&
            used - sample.cpuMs >= (now - sample.at) * MIN_PROGRESS_CPU_SHARE;
          if (!progressed) {
            reason = `its process used no CPU in the last ${now - sample.at} ms`;
            break;
          }
          this.log.info("kernel still starting on a busy node: waiting longer", {
            language: this.language,
            kernelPid: this.child.pid,
            waitedMs: now - started,
          });
        }
        if (now >= ceiling) {
          reason = `the ${ceilingMs} ms ceiling`;
          break;
        }
        // The first sample only opens a window: whether the kernel uses CPU shows at the next.
        sample = { at: now, cpuMs: used };
        deadline = Math.min(now + PROGRESS_WINDOW_MS, ceiling);
      }
      if (await this.answersKernelInfo()) return;
    }
    throw new Error(`kernel did not answer within ${Date.now() - started} ms (timeout ${timeoutMs} ms; ${reason})`);
  }

  /** One kernel_info_request; true once its status arrives on iopub, false after 250 ms without. */
  private async answersKernelInfo(): Promise<boolean> {
    if (this.death) throw new Error(`kernel failed to start (${this.death.exitDescription})`);
    // iopub is a PUB/SUB pair: the subscription may not have reached the kernel yet (the
    // "slow joiner"), so the caller asks again until a status message for its request arrives on iopub.
    const { header, frames } = this.codec.encode("kernel_info_request", {});
    const seen = new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => {
        this.pending.delete(header.msg_id);
        resolve(false);
      }, 250);
      this.pending.set(header.msg_id, {
        onIopub: () => {
          clearTimeout(timer);
          resolve(true);
        },
        onReply: () => {},
        onDeath: () => resolve(false),
      });
    });
    await this.shellOut.send(frames);
    const ok = await seen;
    // Keep the entry a little longer so the matching shell reply is consumed quietly.
    if (ok) setTimeout(() => this.pending.delete(header.msg_id), 1000).unref();
    return ok;
  }

  /** Runs code; resolves with execute_reply's content once the kernel is idle again. */
  execute(code: string, options: ExecuteOptions = {}): Promise<Content> {
    if (this.death) return Promise.reject(this.death);
    const silent = options.silent ?? false;
    const { header, frames } = this.codec.encode("execute_request", {
      code,
      silent,
      store_history: !silent,
      user_expressions: {},
      allow_stdin: false,
      stop_on_error: false,
    });
    return new Promise<Content>((resolve, reject) => {
      let reply: Content | undefined;
      let idle = false;
      const finish = () => {
        if (reply && idle) {
          this.pending.delete(header.msg_id);
          resolve(reply);
        }
      };
      this.pending.set(header.msg_id, {
        onIopub: (message) => {
          if (message.header.msg_type === "status") {
            if (message.content.execution_state === "idle") {
              idle = true;
              finish();
            }
            return;
          }
          options.onOutput?.(message);
        },
        onReply: (message) => {
          reply = message.content;
          finish();
        },
        onDeath: reject,
      });
      this.shellOut.send(frames).catch((error: unknown) => {
        this.pending.delete(header.msg_id);
        reject(error);
      });
    });
  }

  /** Interrupts the running cell the way Jupyter's signal interrupt mode does. */
  interrupt(): void {
    if (this.death || !this.child.pid) return;
    try {
      process.kill(this.child.pid, "SIGINT");
    } catch {
      // already gone: the exit handler reports it
    }
  }

  /** Asks the kernel to shut down, then kills its whole process group; idempotent. */
  async shutdown(graceMs = 1500): Promise<void> {
    const started = performance.now();
    const wasAlive = !this.death;
    this.stopping = true;
    if (wasAlive) {
      const { frames } = this.codec.encode("shutdown_request", { restart: false });
      this.controlOut.send(frames).catch(() => undefined);
      const timer = new Promise<void>((resolve) => setTimeout(resolve, graceMs).unref());
      await Promise.race([this.exited, timer]);
    }
    const graceful = wasAlive && this.death !== undefined;
    this.killGroup();
    await this.exited;
    await this.groupReaped();
    this.closeSockets();
    await rm(this.dir, { recursive: true, force: true });
    if (wasAlive) {
      this.log.info("kernel stopped", {
        language: this.language,
        kernelPid: this.child.pid,
        graceful,
        ms: Math.round(performance.now() - started),
      });
    }
  }

  private killGroup(): void {
    const pid = this.child.pid;
    if (!pid) return;
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      // the group is already gone
    }
  }

  /**
   * Waits (at most 5 s) until no process of the kernel's group is left, reaped ones included: what it forked
   * counts against the sandbox's process limit until then, and a new kernel could not start.
   */
  private async groupReaped(): Promise<void> {
    const pid = this.child.pid;
    if (!pid) return;
    const deadline = performance.now() + 5000;
    while (performance.now() < deadline) {
      try {
        process.kill(-pid, 0);
      } catch {
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  private closeSockets(): void {
    for (const socket of [this.shell, this.control, this.iopub]) if (!socket.closed) socket.close();
  }

  private async readLoop(
    socket: zmq.Dealer | zmq.Subscriber,
    route: (message: JupyterMessage, pending: Pending) => void,
  ): Promise<void> {
    try {
      for await (const frames of socket) {
        let message: JupyterMessage;
        try {
          message = this.codec.decode(frames);
        } catch (error) {
          this.log.warn("dropped a kernel message", { language: this.language, error: String(error) });
          continue;
        }
        const parentId = message.parentHeader.msg_id;
        const pending = parentId ? this.pending.get(parentId) : undefined;
        if (pending) route(message, pending);
      }
    } catch (error) {
      if (!socket.closed) this.log.warn("kernel socket failed", { language: this.language, error: String(error) });
    }
  }
}

/** Kernel stdout/stderr are diagnostics (user output goes over iopub): log them line by line. */
function forwardLines(child: ChildProcess, language: string, log: Logger): void {
  for (const [stream, name] of [
    [child.stdout, "stdout"],
    [child.stderr, "stderr"],
  ] as const) {
    let buffered = "";
    stream?.setEncoding("utf8");
    stream?.on("data", (chunk: string) => {
      buffered += chunk;
      let newline = buffered.indexOf("\n");
      while (newline !== -1) {
        const line = buffered.slice(0, newline).trimEnd();
        buffered = buffered.slice(newline + 1);
        if (line)
          log.info("kernel output", { language, kernelPid: child.pid, stream: name, line: line.slice(0, 2000) });
        newline = buffered.indexOf("\n");
      }
      if (buffered.length > 64 * 1024) buffered = "";
    });
  }
}
