import type { Code as ConnectCode } from "@connectrpc/connect";

/**
 * The Connect codes envd raises or maps (the gRPC status codes, fixed by the protocol), as connect-es's `Code`.
 * Written out instead of imported: importing `Code`'s value evaluates connect-es's whole entry module in the bundle
 * (its errors, and through them protobuf-es's well-known types), and envd answers `/health` and `/init` before it
 * loads Connect at all (server.ts). errors.test.ts checks every value against connect-es's own.
 */
export const Code = {
  Canceled: 1,
  Unknown: 2,
  InvalidArgument: 3,
  DeadlineExceeded: 4,
  NotFound: 5,
  AlreadyExists: 6,
  PermissionDenied: 7,
  ResourceExhausted: 8,
  FailedPrecondition: 9,
  Aborted: 10,
  OutOfRange: 11,
  Unimplemented: 12,
  Internal: 13,
  Unavailable: 14,
  DataLoss: 15,
  Unauthenticated: 16,
} as const satisfies Record<string, ConnectCode>;
export type Code = ConnectCode;

const CODE_NAMES = new Map<number, string>(
  Object.entries(Code).map(([name, value]) => [value, name.replace(/^./, (c) => c.toLowerCase())]),
);

/**
 * envd's one error type. RPC handlers throw it as is: it has the shape connect-es recognises as a ConnectError
 * (`ConnectError[Symbol.hasInstance]` checks the name, code, rawMessage, metadata, details and cause), so Connect
 * sends its code and message unchanged. The HTTP routes map its code to a status in exactly one place
 * (http/respond.ts). `rawMessage` is the text clients see: it names the path, pid or user at fault.
 *
 * It does not extend connect-es's class, for the reason `Code` is written out above.
 */
export class EnvdError extends Error {
  override readonly name = "ConnectError";
  readonly rawMessage: string;
  readonly details: never[] = [];
  override readonly cause: unknown = undefined;
  #metadata: Headers | undefined;

  constructor(
    readonly code: Code,
    message: string,
  ) {
    // The message connect-es gives its errors: "[invalid_argument] path '/x' does not exist".
    super(`[${(CODE_NAMES.get(code) ?? String(code)).replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)}] ${message}`);
    this.rawMessage = message;
  }

  /** Made when Connect asks for it: `Headers` is installed with the services (web-headers.ts), not before. */
  get metadata(): Headers {
    this.#metadata ??= new Headers();
    return this.#metadata;
  }
}

export const invalidArgument = (message: string) => new EnvdError(Code.InvalidArgument, message);
export const notFound = (message: string) => new EnvdError(Code.NotFound, message);
export const unauthenticated = (message: string) => new EnvdError(Code.Unauthenticated, message);
export const permissionDenied = (message: string) => new EnvdError(Code.PermissionDenied, message);
export const alreadyExists = (message: string) => new EnvdError(Code.AlreadyExists, message);
export const internal = (message: string) => new EnvdError(Code.Internal, message);
export const unimplemented = (message: string) => new EnvdError(Code.Unimplemented, message);
export const failedPrecondition = (message: string) => new EnvdError(Code.FailedPrecondition, message);
export const resourceExhausted = (message: string) => new EnvdError(Code.ResourceExhausted, message);
export const unavailable = (message: string) => new EnvdError(Code.Unavailable, message);

/**
 * Turns a Node filesystem error into an EnvdError that names the path involved. Whatever the
 * request itself runs into (a read-only mount, a busy file, a value the kernel rejects) is
 * the client's error; only failures of the machine (EIO, out of descriptors or memory) stay
 * `internal`. E2B's envd answers 500 for all but ENOSPC and ENOENT (issue 18).
 */
export function fromFsError(error: unknown, path: string): EnvdError {
  if (error instanceof EnvdError) return error;
  const errno = (error as NodeJS.ErrnoException | undefined)?.code;
  switch (errno) {
    case "ENOENT":
      return notFound(`path '${path}' does not exist`);
    case "EACCES":
    case "EPERM":
      return permissionDenied(`permission denied for path '${path}'`);
    case "EROFS":
      return permissionDenied(`path '${path}' is on a read-only file system`);
    case "ETXTBSY":
      return failedPrecondition(`file '${path}' is a program being run (text file busy)`);
    case "EBUSY":
      return failedPrecondition(`path '${path}' is busy (in use or a mount point)`);
    case "ENOTSUP":
    case "EOPNOTSUPP":
      return failedPrecondition(`the file system of '${path}' does not support this operation`);
    case "ENXIO":
    case "ENODEV":
      return failedPrecondition(`path '${path}' is a device or special file that cannot be opened`);
    case "EINVAL":
      return invalidArgument(`the kernel rejected the operation on '${path}' as invalid`);
    case "EFBIG":
      return invalidArgument(`file '${path}' would be larger than its file system allows`);
    case "EMLINK":
      return invalidArgument(`'${path}' would have too many links`);
    case "EEXIST":
      return alreadyExists(`path '${path}' already exists`);
    case "ENOTDIR":
      return invalidArgument(`a component of path '${path}' is not a directory`);
    case "EISDIR":
      return invalidArgument(`path '${path}' is a directory`);
    case "ENOTEMPTY":
      return invalidArgument(`directory '${path}' is not empty`);
    case "ENAMETOOLONG":
      return invalidArgument(`path '${path}' is too long`);
    case "ELOOP":
      return invalidArgument(`path '${path}' has too many levels of symbolic links`);
    case "EXDEV":
      return invalidArgument(`cannot move across filesystems to '${path}'`);
    case "ENOSPC":
    case "EDQUOT":
      return resourceExhausted("not enough disk space available");
    case "EIO":
      // A kernel interface refusing what was asked (a write to /proc/self/mem at an unmapped address) is the
      // client's; an I/O error anywhere else is the machine's.
      if (/^\/(proc|sys)(\/|$)/.test(path)) {
        return failedPrecondition(`the kernel interface '${path}' refused the operation (I/O error)`);
      }
      return internal(`filesystem error on '${path}': ${(error as Error | undefined)?.message ?? String(error)}`);
    default:
      return internal(`filesystem error on '${path}': ${(error as Error | undefined)?.message ?? String(error)}`);
  }
}

export function toEnvdError(error: unknown): EnvdError {
  if (error instanceof EnvdError) return error;
  if (isConnectError(error)) return new EnvdError(error.code, error.rawMessage);
  return internal(error instanceof Error ? error.message : String(error));
}

/** A connect-es error (Connect's own, raised while decoding a request), recognised by shape as connect-es does. */
function isConnectError(error: unknown): error is { code: Code; rawMessage: string } {
  const candidate = error as { name?: unknown; code?: unknown; rawMessage?: unknown } | null;
  return (
    error instanceof Error &&
    candidate?.name === "ConnectError" &&
    typeof candidate.code === "number" &&
    typeof candidate.rawMessage === "string"
  );
}
