import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, test } from "vitest";
import { requestDecodeError } from "./rpc-decode-errors.js";

describe("connect-es request decode errors", () => {
  test.each([
    ["parse binary: premature EOF", "cannot decode message filesystem.StatRequest from binary: premature EOF"],
    ["decompression failed", "cannot decompress the filesystem.StatRequest message: it is truncated or corrupt"],
    [
      "received compressed envelope, but do not know how to decompress",
      "a filesystem.StatRequest message is flagged compressed but the request names no encoding",
    ],
  ])("internal '%s' becomes invalid_argument", (message, expected) => {
    const relabelled = requestDecodeError(new ConnectError(message, Code.Internal), "filesystem.StatRequest");
    expect({ code: relabelled?.code, message: relabelled?.rawMessage }).toEqual({
      code: Code.InvalidArgument,
      message: expected,
    });
  });

  test("other errors stay as they are", () => {
    expect(requestDecodeError(new ConnectError("disk on fire", Code.Internal), "x.Y")).toBeUndefined();
    expect(requestDecodeError(new ConnectError("parse binary: x", Code.Unknown), "x.Y")).toBeUndefined();
  });
});
