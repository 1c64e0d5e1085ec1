import type { ServerResponse } from "node:http";
import { Code, type EnvdError, toEnvdError } from "../errors.js";

/** E2B's envd HTTP error body: {"code": <status>, "message": "..."}. */
export function sendJsonError(res: ServerResponse, status: number, message: string): void {
  sendJson(res, status, { code: status, message });
}

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const payload = JSON.stringify(body);
  res.writeHead(status, {
    "Content-Type": "application/json; charset=utf-8",
    "Content-Length": Buffer.byteLength(payload),
    "Cache-Control": "no-store",
  });
  res.end(payload);
}

/** The one place an EnvdError code becomes an HTTP status for envd's plain HTTP routes. */
export function httpStatusOf(error: EnvdError): number {
  switch (error.code) {
    case Code.InvalidArgument:
    case Code.FailedPrecondition:
    case Code.OutOfRange:
      return 400;
    case Code.Unauthenticated:
      return 401;
    case Code.PermissionDenied:
      return 403;
    case Code.NotFound:
      return 404;
    case Code.AlreadyExists:
    case Code.Aborted:
      return 409;
    case Code.ResourceExhausted:
      // The only exhaustion envd reports is disk space; E2B's SDK maps 507 to NotEnoughSpaceError.
      return 507;
    case Code.Unimplemented:
      return 501;
    case Code.Unavailable:
      return 503;
    case Code.DeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

export function sendError(res: ServerResponse, error: unknown): void {
  const envdError = toEnvdError(error);
  sendJsonError(res, httpStatusOf(envdError), envdError.rawMessage);
}
