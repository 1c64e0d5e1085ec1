/**
 * The gateway's one error type. `status` is the HTTP status the request gets; the mapping
 * to a response body happens in one place (server.ts). Messages are E2B's plain-text ones
 * where the SDK surfaces them (e.g. "Context <id> not found").
 */
export class GatewayError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = "GatewayError";
  }
}

export const badRequest = (message: string) => new GatewayError(400, message);
export const unauthorized = (message: string) => new GatewayError(401, message);
export const notFound = (message: string) => new GatewayError(404, message);
export const internal = (message: string) => new GatewayError(500, message);

export function toGatewayError(error: unknown): GatewayError {
  if (error instanceof GatewayError) return error;
  return internal(error instanceof Error ? error.message : String(error));
}
