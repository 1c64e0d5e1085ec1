import { Code, ConnectError } from "@connectrpc/connect";

/** What went wrong in the master, independent of transport; mapped to Connect codes in `toConnectError`. */
export type MasterErrorKind =
  | "not_found"
  | "conflict"
  | "busy"
  | "forbidden"
  | "invalid"
  | "quota"
  | "unavailable"
  | "unimplemented"
  | "internal";

export class MasterError extends Error {
  constructor(
    readonly kind: MasterErrorKind,
    message: string,
    /** Seconds a client should wait before retrying (quota only). */
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
    this.name = "MasterError";
  }
}

const CODES: Record<MasterErrorKind, Code> = {
  not_found: Code.NotFound,
  conflict: Code.FailedPrecondition,
  busy: Code.Aborted,
  forbidden: Code.PermissionDenied,
  invalid: Code.InvalidArgument,
  quota: Code.ResourceExhausted,
  unavailable: Code.Unavailable,
  unimplemented: Code.Unimplemented,
  internal: Code.Internal,
};

export function toConnectError(error: unknown): ConnectError {
  if (error instanceof ConnectError) return error;
  if (error instanceof MasterError) {
    const metadata = new Headers();
    if (error.retryAfterSeconds !== undefined) metadata.set("retry-after", String(error.retryAfterSeconds));
    return new ConnectError(error.message, CODES[error.kind], metadata);
  }
  return new ConnectError(error instanceof Error ? error.message : String(error), Code.Internal);
}

export function notFound(sandboxId: string): MasterError {
  return new MasterError("not_found", `Sandbox "${sandboxId}" doesn't exist or you don't have access to it`);
}
