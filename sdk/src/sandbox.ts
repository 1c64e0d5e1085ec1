import { Artifacts } from "./artifacts.js";
import {
  type CodeInterpreter,
  type Context,
  type CreateCodeContextOpts,
  type Execution,
  CodeInterpreter as Gateway,
  type RunCodeOpts,
} from "./code.js";
import { Commands } from "./commands.js";
import { ConnectionConfig, type ConnectionOpts } from "./config.js";
import { checkHealth, type EnvdEndpoint, envdEndpoint, envdRpc } from "./envd.js";
import { SandboxError } from "./errors.js";
import { type SandboxEvent, type SandboxEventsOpts, sandboxEvents } from "./events.js";
import { Filesystem } from "./files.js";
import { Ports } from "./ports.js";
import { Pty } from "./pty.js";
import {
  connectSandbox,
  createSandbox,
  getSandboxInfo,
  getSandboxMetrics,
  killSandbox,
  pauseSandbox,
  type SandboxApiOpts,
  type SandboxConnection,
  type SandboxConnectOpts,
  type SandboxCreateOpts,
  type SandboxInfo,
  type SandboxListOpts,
  type SandboxMetrics,
  SandboxPaginator,
  setSandboxTimeout,
} from "./sandbox-api.js";
import type { FileUrlOpts } from "./signature.js";
import {
  type CreateSnapshotOpts,
  createSnapshot,
  deleteSnapshot,
  forkSandbox,
  type SandboxForkOpts,
  type SnapshotInfo,
  type SnapshotListOpts,
  SnapshotPaginator,
} from "./snapshot-api.js";

/** What a Sandbox instance needs: where it is (from the API or given directly) and how to reach it. */
export interface SandboxOpts extends ConnectionOpts, SandboxConnection {}

const DEBUG_ENVD_VERSION = "99.99.99";

/**
 * A Warren sandbox, E2B-compatible: `Sandbox.create()`, `Sandbox.connect(id)`, then
 * `sandbox.commands`, `.files`, `.pty`, `.ports`, `.runCode(...)`, `.events()`.
 */
export class Sandbox {
  static readonly defaultTemplate: string = "base";

  readonly sandboxId: string;
  readonly sandboxDomain: string | undefined;
  readonly envdVersion: string;
  readonly trafficAccessToken: string | undefined;
  readonly commands: Commands;
  readonly files: Filesystem;
  readonly pty: Pty;
  readonly ports: Ports;
  /** Files and folders published out of this sandbox (Warren's extra). */
  readonly artifacts: Artifacts;
  readonly connectionConfig: ConnectionConfig;
  protected readonly envd: EnvdEndpoint;
  private readonly code: CodeInterpreter;
  private readonly connectionOpts: ConnectionOpts;

  /** Prefer Sandbox.create / Sandbox.connect; this binds to a sandbox whose connection you already have. */
  constructor(opts: SandboxOpts) {
    const { sandboxId, sandboxDomain, envdVersion, envdAccessToken, trafficAccessToken, ...connection } = opts;
    this.connectionOpts = connection;
    this.connectionConfig = new ConnectionConfig(connection);
    this.sandboxId = sandboxId;
    this.sandboxDomain = sandboxDomain;
    this.envdVersion = envdVersion;
    this.trafficAccessToken = trafficAccessToken;
    this.envd = envdEndpoint(this.connectionConfig, sandboxId, sandboxDomain, envdAccessToken);
    const rpc = envdRpc(this.envd);
    this.commands = new Commands(rpc, this.envd, this.connectionConfig);
    this.files = new Filesystem(rpc, this.envd, this.connectionConfig);
    this.pty = new Pty(rpc, this.envd, this.connectionConfig, this.commands);
    this.ports = new Ports(this.connectionConfig, sandboxId, sandboxDomain, trafficAccessToken);
    this.artifacts = new Artifacts(this.connectionConfig, sandboxId);
    this.code = new Gateway(this.connectionConfig, sandboxId, sandboxDomain, envdAccessToken, trafficAccessToken);
  }

  /** Creates a sandbox (`POST /v2/sandboxes`, with an automatic Idempotency-Key reused on retries). */
  static async create<S extends typeof Sandbox>(this: S, opts?: SandboxCreateOpts): Promise<InstanceType<S>>;
  static async create<S extends typeof Sandbox>(
    this: S,
    template: string,
    opts?: SandboxCreateOpts,
  ): Promise<InstanceType<S>>;
  static async create<S extends typeof Sandbox>(
    this: S,
    templateOrOpts?: string | SandboxCreateOpts,
    maybeOpts?: SandboxCreateOpts,
  ): Promise<InstanceType<S>> {
    const opts = (typeof templateOrOpts === "string" ? maybeOpts : templateOrOpts) ?? {};
    // biome-ignore lint/complexity/noThisInStatic: a subclass (e.g. a code sandbox) has its own default template
    const template = typeof templateOrOpts === "string" ? templateOrOpts : (opts.template ?? this.defaultTemplate);
    const config = new ConnectionConfig(opts);
    const connection: SandboxConnection = config.debug
      ? { sandboxId: "debug_sandbox_id", envdVersion: DEBUG_ENVD_VERSION }
      : await createSandbox(template, opts);
    // biome-ignore lint/complexity/noThisInStatic: create/connect return an instance of the subclass they are called on
    return new this({ ...connectionOptsOf(opts), ...connection }) as InstanceType<S>;
  }

  /**
   * Connects to a sandbox by id (resuming it if paused): `POST /v2/sandboxes/{id}/connect`.
   * For a self-hosted proxy without wildcard DNS pass `sandboxUrl` (the proxy) — requests then
   * carry `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers.
   */
  static async connect<S extends typeof Sandbox>(
    this: S,
    sandboxId: string,
    opts: SandboxConnectOpts = {},
  ): Promise<InstanceType<S>> {
    const config = new ConnectionConfig(opts);
    const connection: SandboxConnection = config.debug
      ? { sandboxId, envdVersion: DEBUG_ENVD_VERSION }
      : await connectSandbox(sandboxId, opts);
    // biome-ignore lint/complexity/noThisInStatic: create/connect return an instance of the subclass they are called on
    return new this({ ...connectionOptsOf(opts), ...connection }) as InstanceType<S>;
  }

  /** Resumes this sandbox if paused and extends its timeout (never shortens it). */
  async connect(
    opts: Omit<SandboxConnectOpts, keyof ConnectionOpts> & Pick<ConnectionOpts, "signal"> = {},
  ): Promise<this> {
    if (!this.connectionConfig.debug) await connectSandbox(this.sandboxId, { ...this.connectionOpts, ...opts });
    return this;
  }

  /**
   * Forks a sandbox: it is captured once (kept running, its id and end of life unchanged) and `count`
   * sandboxes start from that capture. One entry per fork: a Sandbox, or the Error that kept it from
   * starting. An unknown source throws SandboxNotFoundError.
   */
  static async fork<S extends typeof Sandbox>(
    this: S,
    sandboxId: string,
    opts: SandboxForkOpts = {},
  ): Promise<Array<InstanceType<S> | Error>> {
    const results = await forkSandbox(sandboxId, opts);
    const connection = connectionOptsOf(opts);
    // biome-ignore lint/complexity/noThisInStatic: forks are instances of the subclass fork is called on
    return results.map((r) => (r instanceof Error ? r : (new this({ ...connection, ...r }) as InstanceType<S>)));
  }

  fork(
    opts: Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> & Pick<SandboxForkOpts, "count" | "timeoutMs"> = {},
  ): Promise<Array<this | Error>> {
    const own = this.constructor as typeof Sandbox;
    return own.fork(this.sandboxId, { ...this.connectionOpts, ...opts }) as Promise<Array<this | Error>>;
  }

  /** Captures a sandbox as a snapshot (it keeps running); `snapshotId` works as a template of `create`. */
  static createSnapshot(sandboxId: string, opts?: CreateSnapshotOpts): Promise<SnapshotInfo> {
    return createSnapshot(sandboxId, opts);
  }

  createSnapshot(
    opts: Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> & Pick<CreateSnapshotOpts, "name"> = {},
  ): Promise<SnapshotInfo> {
    return createSnapshot(this.sandboxId, { ...this.apiOpts(), ...opts });
  }

  static listSnapshots(opts?: SnapshotListOpts): SnapshotPaginator {
    return new SnapshotPaginator(opts);
  }

  /** The snapshots taken from this sandbox. */
  listSnapshots(opts: Omit<SnapshotListOpts, "sandboxId"> = {}): SnapshotPaginator {
    return new SnapshotPaginator({ ...this.apiOpts(), ...opts, sandboxId: this.sandboxId });
  }

  /** `false` when there is no such snapshot. Sandboxes made from it keep running. */
  static deleteSnapshot(snapshotId: string, opts?: SandboxApiOpts): Promise<boolean> {
    return deleteSnapshot(snapshotId, opts);
  }

  static list(opts?: SandboxListOpts): SandboxPaginator {
    return new SandboxPaginator(opts);
  }

  static kill(sandboxId: string, opts?: SandboxApiOpts): Promise<boolean> {
    if (new ConnectionConfig(opts).debug) return Promise.resolve(true);
    return killSandbox(sandboxId, opts);
  }

  kill(opts: Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> = {}): Promise<boolean> {
    return Sandbox.kill(this.sandboxId, { ...this.apiOpts(), ...opts });
  }

  static getInfo(sandboxId: string, opts?: SandboxApiOpts): Promise<SandboxInfo> {
    return getSandboxInfo(sandboxId, opts);
  }

  getInfo(opts: Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> = {}): Promise<SandboxInfo> {
    return getSandboxInfo(this.sandboxId, { ...this.apiOpts(), ...opts });
  }

  static setTimeout(sandboxId: string, timeoutMs: number, opts?: SandboxApiOpts): Promise<void> {
    if (new ConnectionConfig(opts).debug) return Promise.resolve();
    return setSandboxTimeout(sandboxId, timeoutMs, opts);
  }

  setTimeout(timeoutMs: number, opts: Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> = {}): Promise<void> {
    return Sandbox.setTimeout(this.sandboxId, timeoutMs, { ...this.apiOpts(), ...opts });
  }

  static pause(sandboxId: string, opts?: SandboxApiOpts & { keepMemory?: boolean }): Promise<boolean> {
    return pauseSandbox(sandboxId, opts);
  }

  pause(opts: Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> & { keepMemory?: boolean } = {}): Promise<boolean> {
    return pauseSandbox(this.sandboxId, { ...this.apiOpts(), ...opts });
  }

  static getMetrics(
    sandboxId: string,
    opts?: SandboxApiOpts & { start?: Date; end?: Date },
  ): Promise<SandboxMetrics[]> {
    return getSandboxMetrics(sandboxId, opts);
  }

  getMetrics(opts: { start?: Date; end?: Date } = {}): Promise<SandboxMetrics[]> {
    return getSandboxMetrics(this.sandboxId, { ...this.apiOpts(), ...opts });
  }

  /** `true` while envd answers `/health`; `false` once the proxy says the sandbox is gone (502). */
  async isRunning(): Promise<boolean> {
    const healthy = await checkHealth(this.envd, this.connectionConfig.requestTimeoutMs || 60_000);
    if (healthy === undefined) throw new SandboxError(`could not reach sandbox ${this.sandboxId} to check its health`);
    return healthy;
  }

  /** `<port>-<id>.<domain>`; see `sandbox.ports` for URLs and headers that also work under header routing. */
  getHost(port: number): string {
    return this.ports.host(port);
  }

  uploadUrl(path?: string, opts?: FileUrlOpts): Promise<string> {
    return this.files.uploadUrl(path, opts);
  }

  downloadUrl(path: string, opts?: FileUrlOpts): Promise<string> {
    return this.files.downloadUrl(path, opts);
  }

  /** Warren extra: this sandbox's event ledger, from `opts.cursor` on; `follow: true` keeps waiting for more. */
  events(opts: SandboxEventsOpts = {}): AsyncIterable<SandboxEvent> {
    return sandboxEvents(this.connectionConfig, this.sandboxId, opts);
  }

  runCode(code: string, opts?: RunCodeOpts): Promise<Execution> {
    return this.code.runCode(code, opts);
  }

  createCodeContext(opts?: CreateCodeContextOpts): Promise<Context> {
    return this.code.createCodeContext(opts);
  }

  listCodeContexts(): Promise<Context[]> {
    return this.code.listCodeContexts();
  }

  removeCodeContext(context: Context | string): Promise<void> {
    return this.code.removeCodeContext(context);
  }

  restartCodeContext(context: Context | string): Promise<void> {
    return this.code.restartCodeContext(context);
  }

  private apiOpts(): SandboxApiOpts {
    return this.connectionOpts;
  }
}

/** The connection settings of create/connect options (without per-call and sandbox fields). */
function connectionOptsOf(opts: ConnectionOpts): ConnectionOpts {
  const {
    apiKey,
    domain,
    apiUrl,
    sandboxUrl,
    routing,
    insecure,
    debug,
    requestTimeoutMs,
    retries,
    apiHeaders,
    headers,
  } = opts;
  return Object.fromEntries(
    Object.entries({
      apiKey,
      domain,
      apiUrl,
      sandboxUrl,
      routing,
      insecure,
      debug,
      requestTimeoutMs,
      retries,
      apiHeaders,
      headers,
    }).filter(([, v]) => v !== undefined),
  ) as ConnectionOpts;
}
