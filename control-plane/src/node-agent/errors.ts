import { Code, ConnectError } from "@connectrpc/connect";

/** Why the node agent refused or failed a request; mapped to a Connect code in exactly one place (toConnectError). */
export type AgentErrorCode =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "failed_precondition"
  | "resource_exhausted"
  | "unavailable"
  | "unimplemented"
  | "internal";

export class AgentError extends Error {
  constructor(
    readonly code: AgentErrorCode,
    message: string,
  ) {
    super(message);
    this.name = "AgentError";
  }
}

const CONNECT_CODES: Record<AgentErrorCode, Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  already_exists: Code.AlreadyExists,
  failed_precondition: Code.FailedPrecondition,
  resource_exhausted: Code.ResourceExhausted,
  unavailable: Code.Unavailable,
  unimplemented: Code.Unimplemented,
  internal: Code.Internal,
};

export function toConnectError(error: unknown): ConnectError {
  if (error instanceof ConnectError) return error;
  if (error instanceof AgentError) return new ConnectError(error.message, CONNECT_CODES[error.code]);
  return new ConnectError(error instanceof Error ? error.message : String(error), Code.Internal);
}
