import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, test } from "vitest";
import { apiError, envdHttpError, isTransportError, rpcError } from "../src/errors.js";
import {
  AuthenticationError,
  FileNotFoundError,
  InvalidArgumentError,
  NotEnoughSpaceError,
  NotFoundError,
  RateLimitError,
  SandboxError,
  ServiceBusyError,
  TimeoutError,
} from "../src/index.js";

describe("error mapping (one place per layer)", () => {
  test("Connect codes map to E2B's classes; not_found is FileNotFoundError in filesystem calls", () => {
    expect(rpcError(new ConnectError("x", Code.InvalidArgument))).toBeInstanceOf(InvalidArgumentError);
    expect(rpcError(new ConnectError("x", Code.Unauthenticated))).toBeInstanceOf(AuthenticationError);
    expect(rpcError(new ConnectError("x", Code.NotFound))).toBeInstanceOf(NotFoundError);
    expect(rpcError(new ConnectError("x", Code.NotFound), { files: true })).toBeInstanceOf(FileNotFoundError);
    expect(rpcError(new ConnectError("x", Code.ResourceExhausted))).toBeInstanceOf(RateLimitError);
    for (const code of [Code.Unavailable, Code.Canceled, Code.DeadlineExceeded]) {
      expect(rpcError(new ConnectError("x", code))).toBeInstanceOf(TimeoutError);
    }
    const other = rpcError(new ConnectError("boom", Code.Internal));
    expect(other).toBeInstanceOf(SandboxError);
    expect(other.message).toBe("internal: boom");
  });

  test("envd HTTP statuses map to E2B's classes with the body's message", () => {
    expect(envdHttpError(400, '{"code":400,"message":"bad"}')).toBeInstanceOf(InvalidArgumentError);
    expect(envdHttpError(401, "{}")).toBeInstanceOf(AuthenticationError);
    const missing = envdHttpError(404, '{"code":404,"message":"path \'/x\' does not exist"}', { files: true });
    expect(missing).toBeInstanceOf(FileNotFoundError);
    expect(missing.message).toBe("path '/x' does not exist");
    expect(envdHttpError(502, "gone")).toBeInstanceOf(TimeoutError);
    expect(envdHttpError(507, "full")).toBeInstanceOf(NotEnoughSpaceError);
    expect(envdHttpError(500, "oops").message).toBe("500: oops");
  });

  test("API statuses: 401 AuthenticationError, 429 RateLimitError, 503 ServiceBusyError, others SandboxError with statusCode", () => {
    expect(apiError(401, '{"code":401,"message":"no"}').message).toBe(
      "Unauthorized, please check your credentials. - no",
    );
    expect(apiError(429, "{}")).toBeInstanceOf(RateLimitError);
    expect(apiError(503, "{}")).toBeInstanceOf(ServiceBusyError);
    const error = apiError(400, '{"code":400,"message":"Timeout must be greater than 0"}') as SandboxError;
    expect(error.statusCode).toBe(400);
    expect(error.message).toBe("400: Timeout must be greater than 0");
  });

  test("a dropped connection is a transport error; an error the server sent is not", () => {
    const dropped = new ConnectError("premature close", Code.Internal);
    dropped.cause = Object.assign(new Error("premature close"), { code: "ERR_STREAM_PREMATURE_CLOSE" });
    expect(isTransportError(dropped)).toBe(true);
    expect(isTransportError(new ConnectError("reset", Code.Aborted))).toBe(true);
    expect(isTransportError(new ConnectError("process with pid 1 not found", Code.NotFound))).toBe(false);
    expect(isTransportError(new ConnectError("tty not assigned to process", Code.Internal))).toBe(false);
  });
});
