import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, openSync, readFileSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { CliConfig } from "./config.js";
import { CliError, ExitCode } from "./errors.js";
import { type LaunchMessage, type LaunchSpec, launcherLogOf, pidFileOf } from "./launch-spec.js";
import type { Output, Spinner } from "./output.js";

const LAUNCHER = join(dirname(fileURLToPath(import.meta.url)), "launcher.js");

export interface UpOptions {
  detach: boolean;
  apiPort: number;
  proxyPort: number;
  nodeAgents: number;
  poolSize?: number;
  instancePrefix?: string;
  nodeCidr: string[];
  databaseUrl?: string;
  redisUrl?: string;
  /** E2B_DOMAIN mode: the domain and the PEM certificate (for `*.<domain>` and `<domain>`) and key the proxy serves. */
  domain?: string;
  tlsCert?: string;
  tlsKey?: string;
  /** The CA that signed the certificate, when this machine does not trust it (the readiness check uses it). */
  tlsCa?: string;
  timeout: number;
}

// A DNS name of two or more labels (letters, digits, inner hyphens), as a certificate's `*.<domain>` needs.
const DOMAIN = /^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/i;

/** The TLS part of the launch, checked before anything starts: all of domain, certificate and key, or none. */
function tlsSpec(opts: UpOptions): LaunchSpec["tls"] {
  const given = [opts.domain, opts.tlsCert, opts.tlsKey, opts.tlsCa].some((value) => value !== undefined);
  if (!given) return undefined;
  if (!opts.domain || !opts.tlsCert || !opts.tlsKey) {
    throw new CliError(
      "--domain, --tls-cert and --tls-key go together (E2B's domain layout is served over TLS only)",
      "give the domain, and a certificate for it and for *.<domain> with its key",
      ExitCode.usage,
    );
  }
  if (!DOMAIN.test(opts.domain)) {
    throw new CliError(
      `--domain '${opts.domain}' is not a domain name (e.g. sandboxes.example.com)`,
      undefined,
      ExitCode.usage,
    );
  }
  const file = (flag: string, path: string) => {
    const absolute = resolve(path);
    if (!existsSync(absolute)) throw new CliError(`${flag} ${path}: no such file`, undefined, ExitCode.usage);
    return absolute;
  };
  return {
    domain: opts.domain.toLowerCase(),
    certFile: file("--tls-cert", opts.tlsCert),
    keyFile: file("--tls-key", opts.tlsKey),
    ...(opts.tlsCa ? { caFile: file("--tls-ca", opts.tlsCa) } : {}),
  };
}

/** A process that is alive and not a zombie (a reparented launcher may wait to be reaped). */
export function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** The running launcher of this data dir, if its pid file names a live launcher (not a recycled pid). */
export function runningLauncher(dataDir: string): number | undefined {
  const file = pidFileOf(dataDir);
  if (!existsSync(file)) return undefined;
  const pid = Number(readFileSync(file, "utf8").trim());
  if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return undefined;
  try {
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    return cmdline.includes("launcher.js") ? pid : undefined;
  } catch {
    return undefined;
  }
}

function launchSpec(config: CliConfig, opts: UpOptions): LaunchSpec {
  const tls = tlsSpec(opts);
  return {
    dataDir: config.dataDir,
    apiPort: opts.apiPort,
    proxyPort: opts.proxyPort,
    nodeAgents: opts.nodeAgents,
    ...(opts.poolSize !== undefined ? { poolSize: opts.poolSize } : {}),
    ...(opts.instancePrefix ? { instancePrefix: opts.instancePrefix } : {}),
    ...(opts.nodeCidr.length > 0 ? { nodeCidrs: opts.nodeCidr } : {}),
    ...(opts.databaseUrl ? { databaseUrl: opts.databaseUrl } : {}),
    ...(opts.redisUrl ? { redisUrl: opts.redisUrl } : {}),
    ...(tls ? { tls } : {}),
  };
}

type Ready = Extract<LaunchMessage, { type: "ready" }>;

/** Starts the launcher in its own session: a terminal's Ctrl-C reaches only `warren up`, which stops it in order. */
function startLauncher(config: CliConfig, opts: UpOptions): { child: ChildProcess; exited: Promise<number> } {
  mkdirSync(dirname(launcherLogOf(config.dataDir)), { recursive: true });
  const log = openSync(launcherLogOf(config.dataDir), "a");
  const child = spawn(process.execPath, [LAUNCHER], {
    detached: true,
    stdio: ["ignore", log, log, "ipc"],
    env: { ...process.env, WARREN_LAUNCH: JSON.stringify(launchSpec(config, opts)) },
  });
  const exited = new Promise<number>((resolve) => child.once("exit", (code) => resolve(code ?? 1)));
  return { child, exited };
}

/**
 * Follows the launcher's progress until it reports ready; rejects when it fails, exits or takes too long. Its
 * progress after that (a template still being made, announced when ready) goes to `afterReady`.
 */
function launcherReady(
  launcher: { child: ChildProcess; exited: Promise<number> },
  spinner: Spinner,
  config: CliConfig,
  timeoutS: number,
  interrupted: () => boolean,
  afterReady: (line: string) => void,
): Promise<Ready> {
  const logs = `see the logs in ${config.dataDir}/logs`;
  return new Promise<Ready>((resolve, reject) => {
    const timer = setTimeout(() => {
      launcher.child.kill("SIGTERM");
      reject(new CliError(`Warren was not ready after ${timeoutS} s`, logs));
    }, timeoutS * 1000);
    let ready = false;
    launcher.child.on("message", (message: LaunchMessage) => {
      if (message.type === "progress") return ready ? afterReady(message.line) : spinner.update(message.line);
      clearTimeout(timer);
      ready = message.type === "ready";
      if (message.type === "ready") resolve(message);
      else reject(new CliError(`Warren failed to start: ${message.error}`, logs));
    });
    void launcher.exited.then((code) => {
      clearTimeout(timer);
      reject(
        interrupted()
          ? new CliError("interrupted; Warren was stopped", undefined, 130)
          : new CliError(`the launcher exited (${code}) before Warren was ready`, logs),
      );
    });
  });
}

function printReady(out: Output, ready: Ready, pid: number | undefined, config: CliConfig, detach: boolean): void {
  const env = ready.env;
  out.result(
    {
      running: true,
      pid,
      dataDir: config.dataDir,
      envFile: ready.envFile,
      apiUrl: env.E2B_API_URL,
      sandboxUrl: env.E2B_SANDBOX_URL,
      apiKey: env.E2B_API_KEY,
    },
    () => [
      "Point the official e2b SDK (or Warren's) at it:",
      ...Object.entries(env)
        .filter(([key]) => key !== "WARREN_ADMIN_TOKEN")
        .map(([key, value]) => `  export ${key}=${value}`),
      `(also in ${ready.envFile}, with the admin token). ${detach ? "`warren down` stops it." : "Ctrl-C stops it."}`,
    ],
  );
}

/**
 * `warren up`: starts the launcher, shows its progress, and once the cluster is ready either leaves it
 * running (`--detach`) or stays in the foreground until Ctrl-C, which stops it.
 */
export async function up(config: CliConfig, opts: UpOptions, out: Output): Promise<number> {
  const existing = runningLauncher(config.dataDir);
  if (existing !== undefined) {
    out.note(`warren: already running (pid ${existing}, data dir ${config.dataDir})`);
    return status(config, out);
  }
  rmSync(pidFileOf(config.dataDir), { force: true });
  const launcher = startLauncher(config, opts);
  const spinner = out.spinner(`starting Warren in ${config.dataDir}`);
  let interrupted = false;
  const interrupt = () => {
    interrupted = true;
    spinner.update("stopping (sandboxes are removed)");
    launcher.child.kill("SIGTERM");
  };
  process.on("SIGINT", interrupt);
  process.on("SIGTERM", interrupt);
  try {
    const ready = await launcherReady(
      launcher,
      spinner,
      config,
      opts.timeout,
      () => interrupted,
      (line) => out.note(`warren: ${line}`),
    );
    spinner.succeed(`Warren is up (pid ${launcher.child.pid}, data dir ${config.dataDir})`);
    printReady(out, ready, launcher.child.pid, config, opts.detach);
    if (opts.detach) {
      launcher.child.disconnect();
      launcher.child.unref();
      return ExitCode.ok;
    }
    await launcher.exited;
    out.note("warren: stopped");
    return ExitCode.ok;
  } catch (error) {
    spinner.fail(interrupted ? "interrupted" : "Warren did not start");
    await launcher.exited;
    throw error;
  } finally {
    process.off("SIGINT", interrupt);
    process.off("SIGTERM", interrupt);
  }
}

async function waitGone(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  return true;
}

/** Signals a process group, ignoring one that is already gone. */
function killGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // nothing left in the group
  }
}

/**
 * `warren down`: SIGTERM to the launcher, which stops the proxy, the node agents (they remove their
 * sandboxes, mounts and network namespaces), the api, the master and the databases, in that order.
 * Whatever is still in its process group afterwards (a launcher that was SIGKILLed) is killed too.
 */
export async function down(config: CliConfig, out: Output, timeoutS: number): Promise<number> {
  const file = pidFileOf(config.dataDir);
  const recorded = existsSync(file) ? Number(readFileSync(file, "utf8").trim()) : undefined;
  const pid = runningLauncher(config.dataDir);
  if (pid === undefined) {
    // Orphans of a launcher that died (SIGKILL, OOM) are still in its process group. Linux does not
    // reuse a pid while it names a live group, so when the pid itself is free, the group is ours.
    if (recorded && !alive(recorded)) killGroup(recorded, "SIGKILL");
    rmSync(file, { force: true });
    out.result({ stopped: false, running: false, dataDir: config.dataDir }, () =>
      recorded ? `Warren was not running (removed the stale pid file ${file})` : "Warren is not running",
    );
    return ExitCode.ok;
  }
  const spinner = out.spinner(`stopping Warren (pid ${pid}); sandboxes are removed`);
  process.kill(pid, "SIGTERM");
  if (!(await waitGone(pid, timeoutS * 1000))) {
    spinner.update(`still running after ${timeoutS} s: killing its processes`);
    killGroup(pid, "SIGKILL");
    await waitGone(pid, 10_000);
  }
  killGroup(pid, "SIGKILL");
  rmSync(file, { force: true });
  spinner.succeed("Warren stopped");
  out.result({ stopped: true, running: false, pid, dataDir: config.dataDir }, () => "");
  return ExitCode.ok;
}

interface NodeView {
  id: string;
  state?: string;
  status?: string;
}

/** `warren status`: the launcher, the api's health and the node agents; exit 3 when Warren is not running. */
export async function status(config: CliConfig, out: Output): Promise<number> {
  const pid = runningLauncher(config.dataDir);
  let api: "up" | "down" | "unknown" = "unknown";
  let nodes: NodeView[] | undefined;
  if (pid !== undefined && config.apiUrl) {
    try {
      api = (await fetch(`${config.apiUrl}/health`, { signal: AbortSignal.timeout(5_000) })).ok ? "up" : "down";
      if (config.adminToken) {
        const res = await fetch(`${config.apiUrl}/warren/v1/admin/nodes`, {
          headers: { "X-Admin-Token": config.adminToken },
          signal: AbortSignal.timeout(5_000),
        });
        if (res.ok) nodes = (await res.json()) as NodeView[];
      }
    } catch {
      api = "down";
    }
  }
  const running = pid !== undefined;
  out.result(
    {
      running,
      pid: pid ?? null,
      dataDir: config.dataDir,
      apiUrl: running ? (config.apiUrl ?? null) : null,
      sandboxUrl: running ? (config.sandboxUrl ?? null) : null,
      api,
      nodes: nodes?.map((n) => ({ id: n.id, state: n.state ?? n.status })) ?? null,
    },
    () =>
      running
        ? [
            `Warren is running (pid ${pid}, data dir ${config.dataDir})`,
            `  api    ${config.apiUrl ?? "?"} (${api})`,
            `  proxy  ${config.sandboxUrl ?? "?"}`,
            ...(nodes ?? []).map((n) => `  node   ${n.id} (${n.state ?? n.status})`),
          ]
        : [`Warren is not running (data dir ${config.dataDir}); \`warren up --detach\` starts it`],
  );
  return running ? ExitCode.ok : ExitCode.notRunning;
}
