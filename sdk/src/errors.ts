import { Code, ConnectError } from "@connectrpc/connect";

/**
 * Typed errors with the names users of E2B's SDK know. Each class is thrown for one kind of
 * failure; the mapping from wire errors (Connect codes, envd HTTP statuses, API statuses) to a
 * class lives in this file only.
 */

/** Base class for sandbox errors. `statusCode` is the HTTP status of the response that produced it, if any. */
export class SandboxError extends Error {
  statusCode?: number;
  constructor(message?: string, options?: { cause?: unknown; statusCode?: number }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    if (options?.statusCode !== undefined) this.statusCode = options.statusCode;
  }
}

/** A deadline passed: the caller's timeout, a request timeout, or the sandbox's own end of life. */
export class TimeoutError extends SandboxError {}
export class InvalidArgumentError extends SandboxError {}
export class NotEnoughSpaceError extends SandboxError {}
/** Something named in the request does not exist. */
export class NotFoundError extends SandboxError {}
/** A file or directory inside the sandbox does not exist. */
export class FileNotFoundError extends NotFoundError {}
/** The sandbox does not exist (or is no longer running). */
export class SandboxNotFoundError extends NotFoundError {}
/** The template's envd is too old for the requested feature. */
export class TemplateError extends SandboxError {}
export class RateLimitError extends SandboxError {}

/** Credentials were missing or wrong. Like E2B's, not a SandboxError. */
export class AuthenticationError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "AuthenticationError";
  }
}

/** The service refused for now (HTTP 503); nothing changed and the call can be retried. Not a SandboxError. */
export class ServiceBusyError extends Error {
  readonly statusCode = 503;
  constructor(message: string) {
    super(message);
    this.name = "ServiceBusyError";
  }
}

/**
 * Warren extra: a command's stream was resumed but the sandbox no longer held some of its output
 * (it produced more than envd keeps while the client was away). `fromOffset`..`toOffset` is the
 * missing byte range; `toOffset` is undefined when the envd cannot tell (it does not replay).
 */
export class OutputLostError extends SandboxError {
  constructor(
    readonly pid: number,
    readonly fromOffset: number,
    readonly toOffset: number | undefined,
  ) {
    super(
      toOffset === undefined
        ? `output of pid ${pid} after byte ${fromOffset} may be incomplete: the sandbox does not replay output`
        : `output of pid ${pid} lost between bytes ${fromOffset} and ${toOffset}: the sandbox no longer held it`,
    );
  }
}

/**
 * Warren extra: the team's exec policy holds this command or file operation for review. An approver approves
 * `approvalId` (`ExecApprovals.approve`, `warren approvals approve`, the console); then the same request, sent again
 * with `{ approval: approvalId }`, runs once.
 */
export class ApprovalRequiredError extends SandboxError {
  constructor(
    message: string,
    readonly approvalId: string,
    options?: { cause?: unknown; statusCode?: number },
  ) {
    super(message, options);
  }
}

/** Warren extra: a `deny` rule of the team's exec policy refused this command or file operation (it names the rule). */
export class ExecDeniedError extends SandboxError {}

// The gate's messages (proxy/src/exec-gate.ts) name the approval and the rule.
const APPROVAL_IN_MESSAGE = /needs approval .*approval (apr_[0-9a-f]{20})/;
const DENIED_IN_MESSAGE = /denied by exec policy rule/;

function execPolicyError(message: string, options: { cause?: unknown; statusCode?: number }): Error | undefined {
  const approvalId = APPROVAL_IN_MESSAGE.exec(message)?.[1];
  if (approvalId) return new ApprovalRequiredError(message, approvalId, options);
  if (DENIED_IN_MESSAGE.test(message)) return new ExecDeniedError(message, options);
  return undefined;
}

const SANDBOX_TIMEOUT_HINT =
  "This error is likely due to sandbox timeout. You can modify the sandbox timeout by passing 'timeoutMs' when starting the sandbox or calling '.setTimeout' on the sandbox with the desired timeout.";

export const SANDBOX_GONE_MESSAGE =
  "The sandbox was killed or reached its end of life while the request was in flight.";

/** Maps an error from an envd Connect call to an SDK error (E2B's handleRpcError). */
export function rpcError(error: unknown, options: { files?: boolean } = {}): Error {
  if (error instanceof SandboxError || error instanceof AuthenticationError) return error;
  if (!(error instanceof ConnectError)) return error instanceof Error ? error : new SandboxError(String(error));
  const message = error.rawMessage;
  if (error.code === Code.FailedPrecondition || error.code === Code.PermissionDenied) {
    const policy = execPolicyError(message, { cause: error });
    if (policy) return policy;
  }
  switch (error.code) {
    case Code.InvalidArgument:
    case Code.OutOfRange:
      return new InvalidArgumentError(message, { cause: error });
    case Code.Unauthenticated:
      return new AuthenticationError(message, { cause: error });
    case Code.NotFound:
      return options.files
        ? new FileNotFoundError(message, { cause: error })
        : new NotFoundError(message, { cause: error });
    case Code.ResourceExhausted:
      return new RateLimitError(`${message}: The requests are being rate limited.`, { cause: error });
    case Code.Unavailable:
      return new TimeoutError(`${message}: ${SANDBOX_TIMEOUT_HINT}`, { cause: error });
    case Code.Canceled:
      return new TimeoutError(
        `${message}: This error is likely due to exceeding 'requestTimeoutMs'. You can pass the request timeout value as an option when making the request.`,
        { cause: error },
      );
    case Code.DeadlineExceeded:
      return new TimeoutError(
        `${message}: This error is likely due to exceeding 'timeoutMs' — the total time a long running request (like command execution or directory watch) can be active. It can be modified by passing 'timeoutMs' when making the request. Use '0' to disable the timeout.`,
        { cause: error },
      );
    default:
      return new SandboxError(`${Code[error.code]?.toLowerCase() ?? error.code}: ${message}`, { cause: error });
  }
}

/** Maps a non-2xx envd HTTP response (`/files`, `/health`) to an SDK error (E2B's handleEnvdApiError). */
export function envdHttpError(status: number, body: string, options: { files?: boolean } = {}): Error {
  let message = body;
  try {
    const parsed = JSON.parse(body) as { message?: unknown };
    if (typeof parsed.message === "string") message = parsed.message;
  } catch {
    // not JSON: the raw body is the message
  }
  if (status === 403) {
    const policy = execPolicyError(message, { statusCode: status });
    if (policy) return policy;
  }
  switch (status) {
    case 400:
      return new InvalidArgumentError(message, { statusCode: status });
    case 401:
      return new AuthenticationError(message);
    case 404:
      return options.files
        ? new FileNotFoundError(message, { statusCode: status })
        : new NotFoundError(message, { statusCode: status });
    case 429:
      return new RateLimitError(`${message}: The requests are being rate limited.`, { statusCode: status });
    case 502:
      return new TimeoutError(`${message}: ${SANDBOX_TIMEOUT_HINT}`, { statusCode: status });
    case 507:
      return new NotEnoughSpaceError(message, { statusCode: status });
    default:
      return new SandboxError(`${status}: ${message}`, { statusCode: status });
  }
}

/** Maps a non-2xx control-plane response to an SDK error (E2B's handleApiError); endpoint checks come first. */
export function apiError(status: number, body: string): Error {
  let message = body;
  try {
    const parsed = JSON.parse(body) as { message?: unknown };
    if (typeof parsed.message === "string") message = parsed.message;
  } catch {
    // not JSON: the raw body is the message
  }
  return apiErrorFromCode(status, message);
}

/** Maps an API error code and its message to an SDK error (E2B's apiErrorFromCode). */
export function apiErrorFromCode(code: number, message: string): Error {
  switch (code) {
    case 401:
      return new AuthenticationError(`Unauthorized, please check your credentials. - ${message}`);
    case 429:
      return new RateLimitError(`Rate limit exceeded, please try again later - ${message}`, { statusCode: code });
    case 503:
      return new ServiceBusyError(`Service temporarily unavailable, please retry - ${message}`);
    default:
      return new SandboxError(`${code}: ${message}`, { statusCode: code });
  }
}

/** Maps the `{code, message}` of one fork that failed to start (E2B's per-fork errors) to an SDK error. */
export function forkError(code: number, message: string): Error {
  if (code === 404) return new NotFoundError(`${code}: ${message}`, { statusCode: code });
  return apiErrorFromCode(code, message);
}

/** A mid-stream drop or refused connection (retryable), as opposed to an error the server sent. */
export function isTransportError(error: unknown): boolean {
  if (!(error instanceof ConnectError)) return false;
  if (error.code === Code.Aborted) return true;
  if (error.code !== Code.Unavailable && error.code !== Code.Internal && error.code !== Code.Unknown) return false;
  // Errors the server sent carry no Node cause; transport failures wrap the socket/stream error.
  return error.cause !== undefined;
}
