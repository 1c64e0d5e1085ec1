import { CommanderError } from "commander";
import {
  AuthenticationError,
  InvalidArgumentError,
  NotFoundError,
  RateLimitError,
  SandboxError,
  ServiceBusyError,
  TimeoutError,
} from "../errors.js";

/** Exit codes scripts can rely on (the README's table). */
export const ExitCode = {
  ok: 0,
  failure: 1,
  usage: 2,
  /** `warren status`: the cluster is not running. */
  notRunning: 3,
  /** Could not reach the api or proxy at all. */
  unreachable: 4,
  auth: 5,
  notFound: 6,
} as const;

/** A failure the CLI reports: what went wrong, what to do about it, and the exit code. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly hint?: string,
    readonly exitCode: number = ExitCode.failure,
  ) {
    super(message);
  }
}

function transportFailure(error: unknown): boolean {
  const text = `${(error as Error)?.message ?? ""} ${String((error as { cause?: unknown })?.cause ?? "")}`;
  return /ECONNREFUSED|fetch failed|ENOTFOUND|EHOSTUNREACH|ECONNRESET|socket hang up/i.test(text);
}

/** The one mapping from any error (SDK, commander, network) to a CliError with a hint. */
export function toCliError(error: unknown): CliError {
  if (error instanceof CliError) return error;
  if (error instanceof CommanderError) return new CliError(error.message, undefined, ExitCode.usage);
  if (error instanceof AuthenticationError) {
    return new CliError(
      error.message,
      "set an API key with --api-key or WARREN_API_KEY (`warren key create --team <id>` makes one), or run `warren up`, which writes one to .warren/env",
      ExitCode.auth,
    );
  }
  if (error instanceof NotFoundError) {
    return new CliError(error.message, "`warren sandbox list` shows the sandboxes your key can see", ExitCode.notFound);
  }
  if (error instanceof RateLimitError || error instanceof ServiceBusyError) {
    return new CliError(error.message, "retry in a moment");
  }
  if (error instanceof TimeoutError) return new CliError(error.message, "`warren sandbox info <id>` shows its state");
  if (error instanceof InvalidArgumentError) return new CliError(error.message, undefined, ExitCode.usage);
  if (transportFailure(error)) {
    return new CliError(
      `could not reach Warren: ${(error as Error).message}`,
      "is it running? `warren status` tells; `warren up --detach` starts it; --api-url / WARREN_API_URL point elsewhere",
      ExitCode.unreachable,
    );
  }
  if (error instanceof SandboxError) return new CliError(error.message);
  return new CliError(error instanceof Error ? error.message : String(error));
}
