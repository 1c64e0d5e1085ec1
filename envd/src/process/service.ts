import { accessSync, closeSync, constants, existsSync } from "node:fs";
import { Code, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { Spawner } from "@warren/platform/spawner";
import { WorkloadCgroup } from "@warren/platform/workload";
import type { Process, ProcessInput, StartRequest, StreamInputRequest } from "@warren/proto/process/process_pb";
import { Signal } from "@warren/proto/process/process_pb";
import { requestUser } from "../auth.js";
import type { Closable, EnvdContext } from "../context.js";
import { EnvdError, invalidArgument, notFound, unimplemented } from "../errors.js";
import { keepaliveIntervalMs, processEvents, startEvent } from "./event-stream.js";
import { LEASE_HEADER, LeaseBook, parseLeaseMs } from "./leases.js";
import { ManagedProcess } from "./managed-process.js";
import { ProcessRegistry } from "./registry.js";
import { SECRET_ENV_HEADER, SecretMask, secretEnvFromHeader } from "./secret-mask.js";
import { PRLIMIT, planSpawn, ptySize } from "./spawn-plan.js";
import type { Subscription } from "./subscription.js";

/** Request header (Warren extra): replay held output from this byte offset before live output. */
export const REPLAY_FROM_HEADER = "Warren-Replay-From";
/** Response header (Warren extra): offset of the first output byte the stream delivers. */
export const OUTPUT_OFFSET_HEADER = "Warren-Output-Offset";
const KEEPALIVE_HEADER = "Keepalive-Ping-Interval";
// How long close() waits for killed processes to be reaped before it ends their streams anyway.
const SHUTDOWN_GRACE_MS = 2_000;

const SIGNALS: ReadonlyMap<Signal, NodeJS.Signals> = new Map([
  [Signal.SIGKILL, "SIGKILL"],
  [Signal.SIGTERM, "SIGTERM"],
]);

/**
 * envd's process.Process service (E2B-PROTOCOL.md §3.2). Handlers are thin: they parse the
 * request, pick the process from the registry and hand over to ManagedProcess.
 */
export function createProcessService(
  ctx: EnvdContext,
): Closable & { impl: ServiceImpl<typeof Process>; leases: LeaseBook } {
  const registry = new ProcessRegistry(ctx.config.finishedRetentionMs);
  const leases = new LeaseBook(ctx.config.leaseGraceMs, ctx.log);
  const envdPath = ctx.config.processPath;
  const execLauncher = usableLauncher(ctx);
  const processLimit = usableProcessLimit(ctx, execLauncher);
  // The launcher is also the spawner (`warren-exec --serve`): commands are forked by it, not by envd. In a sandbox
  // it was started before envd (`--serve-beside`) and is adopted.
  const { inheritedSpawner } = ctx.config;
  const spawner =
    execLauncher && ctx.config.spawner ? Spawner.start(execLauncher, ctx.log, inheritedSpawner) : undefined;
  // Not used: closing envd's end of its stdin ends it.
  if (!spawner && inheritedSpawner) closeQuietly(inheritedSpawner.requestFd, inheritedSpawner.replyFd);
  const workload = new WorkloadCgroup(
    { procsFd: ctx.config.workloadFd, oomControlFd: ctx.config.workloadOomFd },
    ctx.log,
  );
  let closing = false;

  const writeInput = async (target: ManagedProcess, input: ProcessInput | undefined) => {
    const choice = input?.input;
    switch (choice?.case) {
      case "stdin":
        return target.writeStdin(choice.value);
      case "pty":
        return target.writePty(choice.value);
      default:
        throw invalidArgument(`input for pid ${target.pid} must set stdin or pty`);
    }
  };

  const impl: ServiceImpl<typeof Process> = {
    list() {
      return {
        processes: registry.running().map((p) => ({ pid: p.pid, tag: p.tag, config: p.config })),
      };
    },

    async *start(request, handler) {
      const { started, subscription } = await launch(request, handler);
      yield { event: startEvent(started.pid) };
      yield* responses(subscription, handler);
    },

    async *connect(request, handler) {
      const target = registry.find(request.process);
      const subscription = target.subscribe(replayOffset(handler));
      handler.responseHeader.set(OUTPUT_OFFSET_HEADER, String(subscription.firstOffset));
      yield { event: startEvent(target.pid) };
      yield* responses(subscription, handler);
    },

    async sendInput(request) {
      await writeInput(registry.findRunning(request.process), request.input);
      return {};
    },

    async streamInput(requests) {
      let target: ManagedProcess | undefined;
      for await (const request of requests) {
        target = await handleStreamInput(request, target);
      }
      return {};
    },

    sendSignal(request) {
      const target = registry.findRunning(request.process);
      const signal = SIGNALS.get(request.signal);
      if (!signal) {
        throw unimplemented(`signal ${signalName(request.signal)} is not supported (only SIGKILL and SIGTERM)`);
      }
      target.signal(signal);
      return {};
    },

    closeStdin(request) {
      registry.findRunning(request.process).closeStdin();
      return {};
    },

    update(request) {
      const target = registry.findRunning(request.process);
      if (!request.pty) throw invalidArgument(`update of pid ${target.pid} must give a pty size`);
      target.resize(ptySize(request.pty.size?.cols ?? 0, request.pty.size?.rows ?? 0, false));
      return {};
    },
  };

  /**
   * Spawns the process of a Start request and subscribes the request's stream to it. Once
   * the process runs, any failure here kills it: nothing is left behind unwatched.
   */
  async function launch(
    request: StartRequest,
    handler: HandlerContext,
  ): Promise<{ started: ManagedProcess; subscription: Subscription }> {
    if (closing) throw new EnvdError(Code.Unavailable, "envd is shutting down");
    const user = requestUser(handler.requestHeader.get("authorization"), ctx.state, ctx.users);
    const secretEnv = secretEnvFromHeader(handler.requestHeader.get(SECRET_ENV_HEADER));
    const leaseHeader = handler.requestHeader.get(LEASE_HEADER);
    const leaseMs = leaseHeader === null ? undefined : parseLeaseMs(leaseHeader, LEASE_HEADER);
    const plan = await planSpawn(request, user, ctx.state, envdPath, secretEnv, processLimit, execLauncher);
    registry.checkTagFree(request.tag);
    const started = await ManagedProcess.start(plan, {
      tag: request.tag,
      outputBufferBytes: ctx.config.outputBufferBytes,
      log: ctx.log,
      mask: new SecretMask(Object.values(secretEnv)),
      onSpawn: (pid) => workload.join(pid),
      oomKills: () => workload.oomKills(),
      ...(spawner ? { spawner } : {}),
    });
    try {
      registry.add(started);
      if (leaseMs !== undefined) leases.add(started, leaseMs);
      const subscription = started.subscribe(0);
      // The stream's deadline is the process's lifetime (E2B semantics); a disconnect is not.
      const lifetimeMs = handler.timeoutMs();
      if (lifetimeMs !== undefined) started.limitLifetime(Math.max(lifetimeMs, 0));
      handler.responseHeader.set(OUTPUT_OFFSET_HEADER, String(subscription.firstOffset));
      ctx.log.info("process started", {
        pid: started.pid,
        cmd: plan.command,
        user: user.name,
        tag: request.tag,
        pty: plan.pty !== undefined,
        // Names only: the values never reach a log.
        ...(Object.keys(secretEnv).length > 0 ? { secrets: Object.keys(secretEnv) } : {}),
        ...(leaseMs !== undefined ? { leaseMs } : {}),
      });
      return { started, subscription };
    } catch (error) {
      started.signal("SIGKILL");
      throw error;
    }
  }

  /** One message of a StreamInput call: first the process, then its input, in order. */
  async function handleStreamInput(
    request: StreamInputRequest,
    target: ManagedProcess | undefined,
  ): Promise<ManagedProcess | undefined> {
    const event = request.event;
    switch (event.case) {
      case "start":
        if (target) throw invalidArgument(`input stream already started for pid ${target.pid}`);
        return registry.findRunning(event.value.process);
      case "data":
        if (!target) throw invalidArgument("input stream must start with a start event naming the process");
        if (!target.running) throw notFound(`process with pid ${target.pid} not found (it has exited)`);
        await writeInput(target, event.value.input);
        return target;
      case "keepalive":
        return target;
      default:
        throw invalidArgument("input stream message must be start, data or keepalive");
    }
  }

  return {
    impl,
    leases,
    async close() {
      closing = true;
      leases.close();
      const live = registry.running();
      for (const p of live) p.signal("SIGKILL");
      await Promise.race([
        Promise.all(live.map((p) => p.whenExited())),
        new Promise((resolve) => setTimeout(resolve, SHUTDOWN_GRACE_MS).unref()),
      ]);
      const shuttingDown = new EnvdError(Code.Unavailable, "envd is shutting down");
      for (const p of registry.all()) p.abandon(shuttingDown);
      registry.close();
      spawner?.close();
    },
  };
}

/** A subscription's events as Start/Connect responses, paced by the stream's keepalive interval. */
async function* responses(subscription: Subscription, handler: HandlerContext) {
  const keepaliveMs = keepaliveIntervalMs(handler.requestHeader.get(KEEPALIVE_HEADER));
  for await (const event of processEvents(subscription, keepaliveMs, handler.signal)) {
    yield { event };
  }
}

function replayOffset(handler: HandlerContext): number | undefined {
  const header = handler.requestHeader.get(REPLAY_FROM_HEADER);
  if (header === null) return undefined;
  const offset = Number(header.trim());
  if (header.trim() === "" || !Number.isSafeInteger(offset) || offset < 0) {
    throw invalidArgument(`${REPLAY_FROM_HEADER} must be a byte offset (a non-negative integer), got '${header}'`);
  }
  return offset;
}

function signalName(signal: Signal): string {
  const name = Signal[signal] as string | undefined;
  return name === undefined ? String(signal) : `SIGNAL_${name}`;
}

/** The configured process limit where the sandbox has prlimit to set it (images without util-linux have none). */
/** The static launcher (EnvdConfig.execLauncher) when it is there and executable. */
function usableLauncher(ctx: EnvdContext): string | undefined {
  try {
    accessSync(ctx.config.execLauncher, constants.X_OK);
    return ctx.config.execLauncher;
  } catch {
    ctx.log.info("no launcher beside envd: commands start through prlimit and setpriv", {
      launcher: ctx.config.execLauncher,
    });
    return undefined;
  }
}

function usableProcessLimit(ctx: EnvdContext, execLauncher: string | undefined): number | undefined {
  const limit = ctx.config.processLimit;
  if (limit === undefined || execLauncher !== undefined || existsSync(PRLIMIT)) return limit;
  ctx.log.warn("no prlimit in this sandbox: processes start without the process limit", { limit });
  return undefined;
}

function closeQuietly(...fds: number[]): void {
  for (const fd of fds) {
    try {
      closeSync(fd);
    } catch {
      // Not open (a malformed WARREN_SPAWNER): nothing to end.
    }
  }
}
