import { Code, ConnectError } from "@connectrpc/connect";
import type { Response } from "express";

/** An error the api answers with E2B's body `{"code": <status>, "message": ...}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly errorCode?: string,
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

export const badRequest = (message: string) => new ApiError(400, message);

export function sandboxNotFound(sandboxId: string): ApiError {
  return new ApiError(404, `Sandbox "${sandboxId}" doesn't exist or you don't have access to it`);
}

const STATUS: Partial<Record<Code, number>> = {
  [Code.InvalidArgument]: 400,
  [Code.NotFound]: 404,
  [Code.PermissionDenied]: 403,
  [Code.FailedPrecondition]: 409,
  [Code.Aborted]: 409,
  [Code.AlreadyExists]: 409,
  [Code.ResourceExhausted]: 429,
  [Code.Unavailable]: 503,
  [Code.DeadlineExceeded]: 504,
  [Code.Unimplemented]: 501,
};

const ERROR_CODES: Partial<Record<Code, string>> = {
  [Code.Unavailable]: "sandbox_capacity_unavailable",
  [Code.Internal]: "internal_server_error",
};

/** The one place where a master (Connect) error becomes an HTTP status. */
export function fromMasterError(error: unknown): ApiError {
  if (error instanceof ApiError) return error;
  const e = ConnectError.from(error);
  const retryAfter = e.metadata.get("retry-after");
  return new ApiError(
    STATUS[e.code] ?? 500,
    e.rawMessage,
    ERROR_CODES[e.code],
    retryAfter !== null && /^\d+$/.test(retryAfter) ? Number(retryAfter) : undefined,
  );
}

export function sendError(res: Response, error: ApiError): void {
  if (error.retryAfterSeconds !== undefined) res.setHeader("Retry-After", String(error.retryAfterSeconds));
  res.status(error.status).json({
    code: error.status,
    message: error.message,
    ...(error.errorCode ? { error_code: error.errorCode } : {}),
  });
}
