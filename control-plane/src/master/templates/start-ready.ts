import type { BuildContext } from "../../store/templates.js";
import type { CommandEventOnNode, NodeAgentClient } from "../node-agent-client.js";
import type { CommandOutput } from "./build-log.js";
import { commandEnv } from "./build-steps.js";

/** E2B's ready loop: a failed ready command is retried every 2 s, for at most 10 minutes. */
export const READY_RETRY_MS = 2_000;
export const READY_DEADLINE_MS = 10 * 60_000;
/** One run of the ready command may take this long before it counts as failed. */
const READY_RUN_TIMEOUT_MS = 60_000;

export class StartReadyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StartReadyError";
  }
}

export interface StartReadyInput {
  readonly node: NodeAgentClient;
  readonly sandboxId: string;
  readonly envdAccessToken: string;
  readonly context: BuildContext;
  readonly startCmd: string | null;
  readonly readyCmd: string | null;
  readonly signal: AbortSignal;
  readonly deadlineMs?: number;
  /** Where the start and ready commands' output goes (a build's log), one writer per command run; absent: dropped. */
  readonly output?: (source: "start" | "ready") => CommandOutput;
}

/** The ready command E2B runs when a template names none: 20 s after a start command, else nothing to wait for. */
export function defaultReadyCmd(startCmd: string | null): string {
  return startCmd ? "sleep 20" : "sleep 0";
}

export async function runToExit(
  events: AsyncIterable<CommandEventOnNode>,
  onData?: (stream: "stdout" | "stderr", data: Uint8Array) => void,
): Promise<{ exitCode: number; status: string; stdout: string }> {
  let stdout = "";
  const decoder = new TextDecoder();
  for await (const event of events) {
    if (event.kind === "stdout" || event.kind === "stderr") {
      if (event.kind === "stdout" && stdout.length < 1 << 20) stdout += decoder.decode(event.data, { stream: true });
      onData?.(event.kind, event.data);
    } else if (event.kind === "exit") return { exitCode: event.exitCode, status: event.status, stdout };
  }
  throw new StartReadyError("the command's stream ended without its exit");
}

/**
 * Starts the template's start command in the background (as the context's user, in its workdir, with its env)
 * and runs the ready command until it passes, as E2B's finalize phase and E2B's sandbox boot do. A start command
 * that exits non-zero first fails it; one that exits 0 does not (the ready command must still pass). On success
 * the start command's stream is let go while the process runs on (envd detaches it).
 */
export async function startAndAwaitReady(input: StartReadyInput): Promise<void> {
  const { node, sandboxId, envdAccessToken, context, startCmd, signal } = input;
  const readyCmd = input.readyCmd || defaultReadyCmd(startCmd);
  const env = commandEnv(context);
  const command = (text: string, timeoutMs: number) => ({
    command: text,
    user: context.user,
    // No workdir: the user's home (`~`), as E2B's envd does.
    cwd: context.workdir ?? "~",
    env,
    timeoutMs,
  });
  const startStream = new AbortController();
  const onAbort = () => startStream.abort(signal.reason);
  signal.addEventListener("abort", onAbort, { once: true });
  let startFailure: string | undefined;
  let started: Promise<unknown> = Promise.resolve();
  if (startCmd) {
    const output = input.output?.("start");
    started = runToExit(
      node.runCommand(sandboxId, envdAccessToken, command(startCmd, 0), startStream.signal),
      output ? (stream, data) => output.write(stream, data) : undefined,
    )
      .finally(() => output?.end())
      .then(
        (exit) => {
          if (exit.exitCode !== 0)
            startFailure = `start command failed: ${exit.status || `exit code ${exit.exitCode}`}`;
        },
        (error: unknown) => {
          if (!startStream.signal.aborted) startFailure = `start command failed: ${(error as Error).message}`;
        },
      );
  }
  try {
    const deadline = Date.now() + (input.deadlineMs ?? READY_DEADLINE_MS);
    for (;;) {
      if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : new StartReadyError("cancelled");
      if (startFailure) throw new StartReadyError(startFailure);
      const output = input.output?.("ready");
      const exit = await runToExit(
        node.runCommand(sandboxId, envdAccessToken, command(readyCmd, READY_RUN_TIMEOUT_MS), signal),
        output ? (stream, data) => output.write(stream, data) : undefined,
      )
        .finally(() => output?.end())
        .catch((error: unknown) => ({ exitCode: -1, status: (error as Error).message, stdout: "" }));
      if (exit.exitCode === 0 && !startFailure) return;
      if (startFailure) throw new StartReadyError(startFailure);
      if (Date.now() + READY_RETRY_MS > deadline) {
        throw new StartReadyError(
          `ready command failed: ready command timed out after ${Math.round((input.deadlineMs ?? READY_DEADLINE_MS) / 1000)} s (last: ${exit.status || `exit code ${exit.exitCode}`})`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, READY_RETRY_MS));
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    // Let the start command's stream go (the process runs on) and wait until the call has ended.
    startStream.abort();
    await started;
  }
}
