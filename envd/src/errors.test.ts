import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, test } from "vitest";
import { Code as EnvdCode, EnvdError, fromFsError, notFound } from "./errors.js";
import { httpStatusOf } from "./http/respond.js";

function errno(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: failed`), { code });
}

describe("filesystem errors", () => {
  test.each([
    ["ENOENT", Code.NotFound, 404],
    ["EACCES", Code.PermissionDenied, 403],
    ["EROFS", Code.PermissionDenied, 403],
    ["ETXTBSY", Code.FailedPrecondition, 400],
    ["EBUSY", Code.FailedPrecondition, 400],
    ["EOPNOTSUPP", Code.FailedPrecondition, 400],
    ["ENXIO", Code.FailedPrecondition, 400],
    ["EINVAL", Code.InvalidArgument, 400],
    ["EFBIG", Code.InvalidArgument, 400],
    ["ENAMETOOLONG", Code.InvalidArgument, 400],
    ["ENOTDIR", Code.InvalidArgument, 400],
    ["ENOSPC", Code.ResourceExhausted, 507],
    ["EDQUOT", Code.ResourceExhausted, 507],
  ])("%s is the client's error: %s, HTTP %i", (code, connectCode, status) => {
    const error = fromFsError(errno(code), "/etc/resolv.conf");
    expect(error.code).toBe(connectCode);
    expect(httpStatusOf(error)).toBe(status);
  });

  test("a read-only file system is named in the message", () => {
    expect(fromFsError(errno("EROFS"), "/etc/resolv.conf").rawMessage).toBe(
      "path '/etc/resolv.conf' is on a read-only file system",
    );
  });

  test.each(["EIO", "EMFILE", "ENOMEM"])("%s is the machine's failure: internal, HTTP 500", (code) => {
    const error = fromFsError(errno(code), "/x");
    expect(error.code).toBe(Code.Internal);
    expect(httpStatusOf(error)).toBe(500);
  });

  test("an I/O error from a kernel interface (/proc, /sys) is the client's: a write to /proc/self/mem", () => {
    const error = fromFsError(errno("EIO"), "/proc/self/mem");
    expect(error.code).toBe(Code.FailedPrecondition);
    expect(httpStatusOf(error)).toBeLessThan(500);
    expect(error.rawMessage).toMatch(/kernel interface '\/proc\/self\/mem'/);
  });
});

describe("envd's error is a ConnectError to connect-es", () => {
  test("envd's codes are connect-es's, name for name", () => {
    for (const [name, value] of Object.entries(EnvdCode)) {
      expect(Code[name as keyof typeof Code], name).toBe(value);
    }
    expect(Object.keys(EnvdCode)).toEqual(Object.keys(Code).filter((key) => Number.isNaN(Number(key))));
  });

  test("connect-es recognises it, keeps it as is and gives it its own message", () => {
    const error = notFound("path '/x' does not exist");
    expect(error).toBeInstanceOf(ConnectError);
    expect(ConnectError.from(error)).toBe(error);
    expect(error.message).toBe(new ConnectError("path '/x' does not exist", Code.NotFound).message);
    expect(error.metadata).toBeInstanceOf(Headers);
    expect(error.details).toEqual([]);
  });

  test("every code's message prefix is connect-es's", () => {
    for (const value of Object.values(EnvdCode)) {
      expect(new EnvdError(value, "m").message).toBe(new ConnectError("m", value).message);
    }
  });
});
