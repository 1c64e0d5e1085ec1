import type { GatewayConfig } from "./config.js";
import type { CodeContext } from "./contexts.js";
import type { EnvdEnvironment } from "./envs.js";
import { type Kernel, KernelDiedError } from "./kernels/kernel.js";
import { setEnvCode, unsetEnvCode } from "./kernels/languages.js";
import type { Logger } from "./log.js";
import { errorLine, type OutputLine, outputLine } from "./results.js";

/** A parsed /execute request body. */
export interface ExecuteRequest {
  readonly code: string;
  readonly contextId: string | undefined;
  readonly language: string | undefined;
  readonly envVars: Readonly<Record<string, string>>;
}

/** Where an execution's lines go; `aborted` fires when the client has gone away. */
export interface ExecutionSink {
  write(line: OutputLine): void;
  readonly aborted: AbortSignal;
  /** For logs. */
  readonly requestId: string;
}

export interface ExecutionDeps {
  readonly config: GatewayConfig;
  readonly envd: EnvdEnvironment;
  readonly log: Logger;
}

/**
 * Runs one request's code in a context: waits for the context's turn, applies sandbox-global
 * env vars on the kernel's first execution and the request's env vars for this execution
 * only, streams outputs, and interrupts the kernel if the client leaves or the execution
 * outlives the configured limit (restarting the kernel if the interrupt does not take).
 */
export async function runExecution(
  context: CodeContext,
  request: ExecuteRequest,
  sink: ExecutionSink,
  accessToken: string | undefined,
  deps: ExecutionDeps,
): Promise<void> {
  const release = await context.acquire();
  try {
    if (sink.aborted.aborted) return;
    let kernel: Kernel;
    try {
      kernel = await context.kernel;
    } catch (error) {
      sink.write(errorLine("KernelUnavailable", `the ${context.language} kernel could not be started: ${error}`));
      return;
    }
    await executeIn(context, kernel, request, sink, accessToken, deps);
  } finally {
    release();
  }
}

async function executeIn(
  context: CodeContext,
  kernel: Kernel,
  request: ExecuteRequest,
  sink: ExecutionSink,
  accessToken: string | undefined,
  deps: ExecutionDeps,
): Promise<void> {
  const globals = await applyEnv(context, kernel, request.envVars, accessToken, deps);

  let errorSent = false;
  const write = (line: OutputLine) => {
    if (line.type === "error") {
      if (errorSent) return;
      errorSent = true;
    }
    sink.write(line);
  };

  const stopper = new CellStopper(context, kernel, sink.requestId, deps);
  const execution = kernel.execute(request.code, {
    onOutput: (message) => {
      if (message.header.msg_type === "execute_input") stopper.cellStarted();
      if (message.header.msg_type === "error") stopper.cellFailed();
      const line = outputLine(message);
      if (line) write(line);
    },
  });
  const onAbort = () => stopper.stop("client disconnected");
  sink.aborted.addEventListener("abort", onAbort, { once: true });
  const limitMs = deps.config.executionTimeoutMs;
  const limit =
    limitMs > 0
      ? setTimeout(() => {
          write(errorLine("ExecutionTimeout", `execution exceeded ${limitMs} ms and was interrupted`));
          stopper.stop("execution timeout");
        }, limitMs)
      : undefined;

  const failure = await execution.then(
    () => undefined,
    (error: unknown) => error,
  );
  stopper.settled();
  sink.aborted.removeEventListener("abort", onAbort);
  clearTimeout(limit);

  if (failure instanceof KernelDiedError) {
    write(
      failure.stopped
        ? errorLine("ContextRestarting", "Context was restarted")
        : errorLine(
            "KernelDied",
            `the ${context.language} kernel of context ${context.id} died (${failure.exitDescription}); ` +
              "it was restarted and its state is lost, rerun the code",
          ),
    );
  } else if (failure) {
    write(errorLine("UnexpectedEndOfExecution", String(failure)));
  } else if (!stopper.restarted) {
    await restoreEnv(context, kernel, request.envVars, globals);
  }
}

/**
 * Applies the sandbox-global env vars on a kernel's first execution and this request's
 * env vars, through silent executions; returns the global set (for restoring later).
 */
async function applyEnv(
  context: CodeContext,
  kernel: Kernel,
  envVars: Readonly<Record<string, string>>,
  accessToken: string | undefined,
  deps: ExecutionDeps,
): Promise<Readonly<Record<string, string>>> {
  if (context.globalEnv === undefined) {
    const globals = await deps.envd.fetch(accessToken);
    context.globalEnv = globals;
    // Only what the kernel did not start with: most sandboxes set nothing of their own, and an execution less
    // on the first `runCode` is ~15 ms.
    const missing = Object.fromEntries(
      Object.entries(globals).filter(([name, value]) => context.startEnv[name] !== value),
    );
    const setup = setEnvCode(context.language, missing);
    if (setup) await kernel.execute(setup, { silent: true }).catch(() => undefined);
  }
  const perExecution = setEnvCode(context.language, envVars);
  if (perExecution) await kernel.execute(perExecution, { silent: true }).catch(() => undefined);
  return context.globalEnv;
}

/** Removes this request's env vars again, or resets them to the sandbox-global value they shadowed. */
async function restoreEnv(
  context: CodeContext,
  kernel: Kernel,
  envVars: Readonly<Record<string, string>>,
  globals: Readonly<Record<string, string>>,
): Promise<void> {
  const names = Object.keys(envVars);
  if (names.length === 0) return;
  const reset: Record<string, string> = {};
  for (const name of names) if (globals[name] !== undefined) reset[name] = globals[name];
  const removed = names.filter((name) => reset[name] === undefined);
  const code = unsetEnvCode(context.language, removed) + setEnvCode(context.language, reset);
  await kernel.execute(code, { silent: true }).catch(() => undefined);
}

/**
 * Stops a running cell: SIGINT once the kernel runs it (a SIGINT to a kernel that has not
 * published execute_input yet is ignored and the cell would run on), a second SIGINT after
 * a second unless the cell is already failing, and a kernel restart if the cell still has not ended after the grace period.
 */
class CellStopper {
  private started = false;
  private stopRequested = false;
  private done = false;
  private failed = false;
  restarted = false;

  constructor(
    private readonly context: CodeContext,
    private readonly kernel: Kernel,
    private readonly requestId: string,
    private readonly deps: ExecutionDeps,
  ) {}

  cellStarted(): void {
    if (this.started) return;
    this.started = true;
    if (this.stopRequested) this.interrupt();
  }

  /** The cell raised (e.g. KeyboardInterrupt): it is unwinding, another signal could only hurt. */
  cellFailed(): void {
    this.failed = true;
  }

  settled(): void {
    this.done = true;
  }

  stop(reason: string): void {
    if (this.done || this.stopRequested) return;
    this.stopRequested = true;
    this.deps.log.info("interrupting execution", { contextId: this.context.id, requestId: this.requestId, reason });
    if (this.started) this.interrupt();
    setTimeout(() => {
      if (this.done || this.restarted) return;
      this.restarted = true;
      this.deps.log.warn("kernel ignored the interrupt; restarting it", {
        contextId: this.context.id,
        requestId: this.requestId,
      });
      this.context.restart("interrupt did not stop the execution").catch(() => undefined);
    }, this.deps.config.interruptGraceMs).unref();
  }

  private interrupt(): void {
    this.kernel.interrupt();
    setTimeout(() => {
      if (!this.done && !this.failed && !this.restarted) this.kernel.interrupt();
    }, 1000).unref();
  }
}
