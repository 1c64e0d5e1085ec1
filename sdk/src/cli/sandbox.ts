import { ApiClient } from "../api.js";
import { CommandExitError } from "../commands.js";
import type { ConnectionOpts } from "../config.js";
import type { SandboxEvent } from "../events.js";
import { Sandbox } from "../sandbox.js";
import type { SandboxInfo, SandboxState } from "../sandbox-api.js";
import { CliError, ExitCode } from "./errors.js";
import { type Output, table } from "./output.js";

/** `KEY=value` pairs from repeated flags. */
export function keyValues(pairs: readonly string[] | undefined, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const pair of pairs ?? []) {
    const at = pair.indexOf("=");
    if (at <= 0) throw new CliError(`${what} must be KEY=value, got '${pair}'`, undefined, ExitCode.usage);
    out[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return out;
}

/** A shell command line from exec's arguments: one argument is taken as a command line, several are quoted. */
export function commandLine(args: readonly string[]): string {
  if (args.length === 1) return args[0] as string;
  return args.map((arg) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`)).join(" ");
}

function infoView(info: SandboxInfo) {
  return {
    sandboxId: info.sandboxId,
    templateId: info.templateId,
    state: info.state,
    startedAt: info.startedAt.toISOString(),
    endAt: info.endAt.toISOString(),
    cpuCount: info.cpuCount,
    memoryMB: info.memoryMB,
    envdVersion: info.envdVersion,
    metadata: info.metadata,
  };
}

export interface CreateOptions {
  timeout?: number;
  metadata?: string[];
  env?: string[];
}

export async function createSandbox(
  conn: ConnectionOpts,
  template: string | undefined,
  opts: CreateOptions,
  out: Output,
): Promise<number> {
  const spinner = out.spinner(`creating a sandbox from '${template ?? Sandbox.defaultTemplate}'`);
  try {
    const sandbox = await Sandbox.create(template ?? Sandbox.defaultTemplate, {
      ...conn,
      metadata: keyValues(opts.metadata, "--metadata"),
      envs: keyValues(opts.env, "--env"),
      ...(opts.timeout !== undefined ? { timeoutMs: opts.timeout * 1000 } : {}),
    });
    spinner.succeed(`created sandbox ${sandbox.sandboxId}`);
    const info = await sandbox.getInfo();
    // The id alone on stdout, so `ID=$(warren sandbox create)` works.
    out.result(infoView(info), () => sandbox.sandboxId);
    return ExitCode.ok;
  } catch (error) {
    spinner.fail("could not create a sandbox");
    throw error;
  }
}

export async function listSandboxes(conn: ConnectionOpts, opts: { state?: string; metadata?: string[] }, out: Output) {
  const states = opts.state?.split(",").map((s) => s.trim()) as SandboxState[] | undefined;
  for (const state of states ?? []) {
    if (state !== "running" && state !== "paused") {
      throw new CliError(`--state must be running, paused or both, got '${state}'`, undefined, ExitCode.usage);
    }
  }
  const paginator = Sandbox.list({
    ...conn,
    query: { ...(states ? { state: states } : {}), metadata: keyValues(opts.metadata, "--metadata") },
  });
  const all: SandboxInfo[] = [];
  while (paginator.hasNext) all.push(...(await paginator.nextItems()));
  out.result(all.map(infoView), () =>
    all.length === 0
      ? "no sandboxes"
      : table([
          ["SANDBOX ID", "TEMPLATE", "STATE", "STARTED", "ENDS"],
          ...all.map((s) => [s.sandboxId, s.templateId, s.state, s.startedAt.toISOString(), s.endAt.toISOString()]),
        ]),
  );
  return ExitCode.ok;
}

export async function sandboxInfo(conn: ConnectionOpts, id: string, out: Output): Promise<number> {
  const view = infoView(await Sandbox.getInfo(id, conn));
  out.result(view, () =>
    Object.entries(view).map(
      ([key, value]) => `${key.padEnd(12)} ${typeof value === "object" ? JSON.stringify(value) : value}`,
    ),
  );
  return ExitCode.ok;
}

export async function killSandboxes(conn: ConnectionOpts, ids: string[], out: Output): Promise<number> {
  const results: { sandboxId: string; killed: boolean }[] = [];
  for (const id of ids) results.push({ sandboxId: id, killed: await Sandbox.kill(id, conn) });
  out.result(results.length === 1 ? results[0] : results, () =>
    results.map((r) => (r.killed ? `killed ${r.sandboxId}` : `sandbox ${r.sandboxId} not found`)),
  );
  const missing = results.filter((r) => !r.killed).map((r) => r.sandboxId);
  if (missing.length > 0 && !out.json) {
    throw new CliError(
      `no sandbox ${missing.join(", ")}`,
      "`warren sandbox list` shows the sandboxes your key can see",
      ExitCode.notFound,
    );
  }
  return missing.length > 0 ? ExitCode.notFound : ExitCode.ok;
}

export async function pauseSandbox(conn: ConnectionOpts, id: string, out: Output): Promise<number> {
  const spinner = out.spinner(`pausing ${id}`);
  const paused = await Sandbox.pause(id, conn);
  spinner.succeed(paused ? `paused ${id}` : `${id} was already paused`);
  out.result({ sandboxId: id, paused: true, changed: paused }, () => "");
  return ExitCode.ok;
}

export async function resumeSandbox(conn: ConnectionOpts, id: string, timeout: number | undefined, out: Output) {
  const spinner = out.spinner(`resuming ${id}`);
  await Sandbox.connect(id, { ...conn, ...(timeout !== undefined ? { timeoutMs: timeout * 1000 } : {}) });
  spinner.succeed(`${id} is running`);
  return sandboxInfo(conn, id, out);
}

export interface ExecOptions {
  /** Forward this process's stdin to the command (then close it). */
  stdin?: boolean;
  cwd?: string;
  user?: string;
  env?: string[];
  timeout?: number;
  /** Team secrets the command gets as env vars (names; repeatable). */
  secret?: string[];
  /** Lease in ms: the CLI renews it while it waits; if the CLI goes away the command is reaped after it. */
  leaseMs?: number;
}

/** Runs a command; its output streams through and the CLI exits with the command's exit code (130 after Ctrl-C). */
export async function execInSandbox(
  conn: ConnectionOpts,
  id: string,
  args: string[],
  opts: ExecOptions,
  out: Output,
): Promise<number> {
  if (args.length === 0)
    throw new CliError("no command given", "e.g. `warren sandbox exec ID -- ls -la`", ExitCode.usage);
  const sandbox = await Sandbox.connect(id, conn);
  const stream = !out.json;
  let result: { exitCode: number; stdout: string; stderr: string; error?: string };
  let interrupted = false;
  let onInterrupt: (() => void) | undefined;
  let renewer: NodeJS.Timeout | undefined;
  try {
    const handle = await sandbox.commands.run(commandLine(args), {
      background: true,
      stdin: opts.stdin === true,
      ...(opts.cwd ? { cwd: opts.cwd } : {}),
      ...(opts.user ? { user: opts.user } : {}),
      envs: keyValues(opts.env, "--env"),
      ...(opts.timeout !== undefined ? { timeoutMs: opts.timeout * 1000 } : {}),
      ...(opts.secret?.length ? { secrets: opts.secret } : {}),
      ...(opts.leaseMs !== undefined ? { lease: { ttlMs: opts.leaseMs } } : {}),
      ...(stream
        ? {
            onStdout: (d: string) => void process.stdout.write(d),
            onStderr: (d: string) => void process.stderr.write(d),
          }
        : {}),
    });
    // Ctrl-C ends the command in the sandbox too (a disconnect alone would leave it running there).
    onInterrupt = () => {
      interrupted = true;
      void handle.kill().catch(() => undefined);
    };
    process.once("SIGINT", onInterrupt);
    if (opts.leaseMs !== undefined) {
      renewer = setInterval(
        () => void sandbox.commands.renewLease(handle.pid).catch(() => undefined),
        Math.max(50, Math.floor(opts.leaseMs / 3)),
      );
    }
    if (opts.stdin) {
      for await (const chunk of process.stdin) await handle.sendStdin(chunk as Buffer);
      await handle.closeStdin();
    }
    result = await handle.wait();
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error;
    result = { exitCode: error.exitCode, stdout: error.stdout, stderr: error.stderr, error: error.error };
  } finally {
    if (onInterrupt) process.off("SIGINT", onInterrupt);
    clearInterval(renewer);
  }
  if (interrupted) result = { ...result, exitCode: 130 };
  out.result({ sandboxId: id, ...result }, () => "");
  return result.exitCode;
}

interface LogEntry {
  timestamp: string;
  message?: string;
  line?: string;
  level?: string;
}

/** The sandbox's lifecycle log as the api keeps it (E2B's `GET /v2/sandboxes/{id}/logs`). */
export async function sandboxLogs(conn: ConnectionOpts, id: string, out: Output): Promise<number> {
  const res = await new ApiClient(conn).request<{ logs: LogEntry[] }>({
    method: "GET",
    path: `/v2/sandboxes/${encodeURIComponent(id)}/logs`,
  });
  const logs = res.body?.logs ?? [];
  out.result(logs, () =>
    logs.map((l) => `${l.timestamp}  ${l.level ? `${l.level.padEnd(5)} ` : ""}${l.message ?? l.line ?? ""}`),
  );
  return ExitCode.ok;
}

function eventView(e: SandboxEvent) {
  return { ...e, timestamp: e.timestamp.toISOString() };
}

/** The sandbox's event ledger; `--follow` keeps streaming (resuming after drops) until Ctrl-C. */
export async function sandboxEvents(
  conn: ConnectionOpts,
  id: string,
  opts: { follow?: boolean; cursor?: string; limit?: number },
  out: Output,
): Promise<number> {
  const sandbox = new Sandbox({ ...conn, sandboxId: id, envdVersion: "" });
  const abort = new AbortController();
  const stop = () => abort.abort();
  process.once("SIGINT", stop);
  const events: SandboxEvent[] = [];
  try {
    for await (const event of sandbox.events({
      ...(opts.cursor ? { cursor: opts.cursor } : {}),
      ...(opts.follow ? { follow: true } : {}),
      ...(opts.limit ? { limit: opts.limit } : {}),
      signal: abort.signal,
    })) {
      // Following prints one JSON line per event (NDJSON) under --json; a page prints one array.
      if (opts.follow && out.json) process.stdout.write(`${JSON.stringify(eventView(event))}\n`);
      else if (out.json) events.push(event);
      else {
        const change = event.fromState || event.toState ? ` ${event.fromState || "-"} → ${event.toState || "-"}` : "";
        process.stdout.write(`${event.timestamp.toISOString()}  ${event.id}  ${event.type}${change}\n`);
      }
    }
  } catch (error) {
    if (!abort.signal.aborted) throw error;
  } finally {
    process.off("SIGINT", stop);
  }
  if (out.json && !opts.follow) out.result(events.map(eventView), () => "");
  return ExitCode.ok;
}
