/**
 * envd's plain-HTTP endpoints beside its Connect services, as one contract for envd (the server, envd/src/http)
 * and its callers inside Warren (the node agent's /init and /files, the code gateway's /envs). E2B's SDKs speak
 * the same endpoints; nothing here may change what they see.
 *
 *   POST /init   EnvdInitBody → 204 with X-Envd-Version. Allowed before any token is set, else with the current
 *                one in X-Access-Token.
 *   GET  /envs   → 200 EnvdEnvVars (the sandbox-global env vars /init set); X-Access-Token when a token is set.
 *   /files       query ENVD_FILES_QUERY: GET downloads, POST uploads; X-Access-Token or a URL signature.
 *   GET  /warren/leases/events?after=N   → 200 EnvdLeaseEvents (Warren's own: the process lease journal after
 *                sequence number N, for the master's ledger through the node agent); X-Access-Token.
 */

export const ENVD_INIT_PATH = "/init";
export const ENVD_ENVS_PATH = "/envs";
export const ENVD_FILES_PATH = "/files";
/** Warren's process leases (envd/src/http/leases.ts); the journal is under `${ENVD_LEASES_PATH}/events`. */
export const ENVD_LEASES_PATH = "/warren/leases";
export const ENVD_LEASE_EVENTS_PATH = `${ENVD_LEASES_PATH}/events`;

/** The header that carries envd's access token. */
export const ENVD_ACCESS_TOKEN_HEADER = "X-Access-Token";
/** The header envd's /init answer carries its version in. */
export const ENVD_VERSION_HEADER = "X-Envd-Version";

/** The query parameter names of /files (E2B-PROTOCOL.md §4.1, §4.3). */
export const ENVD_FILES_QUERY = {
  /** The file's path: absolute, relative to the user's home, or `~/…`. What a URL signature covers. */
  path: "path",
  /** The user the operation runs as. */
  username: "username",
  /** E2B's v1 URL signature, instead of the X-Access-Token header. */
  signature: "signature",
  /** Unix seconds after which the signature is refused. */
  signatureExpiration: "signature_expiration",
} as const;

/**
 * The JSON body of POST /init as a caller sends it. E2B's other fields are accepted and ignored by envd; `null`
 * counts as absent.
 */
export interface EnvdInitBody {
  /** Replaces the sandbox-global env vars. */
  readonly envVars?: Readonly<Record<string, string>>;
  /** The new access token; empty clears it. */
  readonly accessToken?: string;
  /** The caller's clock, RFC 3339 (envd accepts it and never sets its own clock from it). */
  readonly timestamp?: string;
  /** Empty keeps the current default user. */
  readonly defaultUser?: string;
  /** Empty clears the default working directory (the user's home). */
  readonly defaultWorkdir?: string;
}

/** The fields of POST /init that envd acts on, parsed. */
export interface EnvdInitRequest {
  envVars?: Record<string, string>;
  accessToken?: string;
  timestamp?: Date;
  defaultUser?: string;
  defaultWorkdir?: string;
}

/** A POST /init body envd refuses; `message` is the text of envd's `invalid_argument` answer. */
export class EnvdInitBodyError extends Error {
  constructor(
    /** The offending field (`envVars.NAME` for one variable), or `body` for the body as a whole. */
    readonly field: string,
    message: string,
  ) {
    super(message);
    this.name = "EnvdInitBodyError";
  }
}

function parseEnvVars(value: unknown): Record<string, string> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new EnvdInitBodyError("envVars", "envVars must be an object of strings");
  }
  const vars: Record<string, string> = {};
  for (const [name, text] of Object.entries(value as Record<string, unknown>)) {
    if (typeof text !== "string") throw new EnvdInitBodyError(`envVars.${name}`, `envVars.${name} must be a string`);
    if (name === "" || name.includes("=") || name.includes("\0")) {
      throw new EnvdInitBodyError(`envVars.${name}`, `invalid env var name '${name}'`);
    }
    vars[name] = text;
  }
  return vars;
}

/** Parses a POST /init body (already JSON-decoded) as envd accepts it; throws EnvdInitBodyError. */
export function parseEnvdInitBody(body: unknown): EnvdInitRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new EnvdInitBodyError("body", "init body must be a JSON object");
  }
  const input = body as Record<string, unknown>;
  const request: EnvdInitRequest = {};
  if (input.envVars !== undefined && input.envVars !== null) request.envVars = parseEnvVars(input.envVars);
  for (const field of ["accessToken", "defaultUser", "defaultWorkdir"] as const) {
    const value = input[field];
    if (value === undefined || value === null) continue;
    if (typeof value !== "string") throw new EnvdInitBodyError(field, `${field} must be a string`);
    request[field] = value;
  }
  if (input.timestamp !== undefined && input.timestamp !== null) {
    const when = typeof input.timestamp === "string" ? new Date(input.timestamp) : undefined;
    if (!when || Number.isNaN(when.getTime())) {
      throw new EnvdInitBodyError("timestamp", "timestamp must be an RFC 3339 date-time");
    }
    request.timestamp = when;
  }
  return request;
}

/** GET /envs's answer: the sandbox-global env vars, name → value. */
export type EnvdEnvVars = Record<string, string>;

/**
 * Reads a GET /envs answer (already JSON-decoded) leniently: anything but an object is no variables, and a value
 * that is not a string is skipped, so a caller never fails on what it only passes on.
 */
export function parseEnvdEnvVars(body: unknown): EnvdEnvVars {
  if (!body || typeof body !== "object" || Array.isArray(body)) return {};
  const vars: EnvdEnvVars = {};
  for (const [name, value] of Object.entries(body)) if (typeof value === "string") vars[name] = value;
  return vars;
}

/** One entry of envd's process lease journal: a background process's lease taken, renewed or reaped. */
export interface EnvdLeaseEvent {
  readonly seq: number;
  /** process.lease | process.lease_renewed | process.lease_reaped */
  readonly type: string;
  readonly pid: number;
  readonly tag?: string;
  readonly ttlMs: number;
  /** A reap's signal (SIGTERM, or SIGKILL after the grace). */
  readonly signal?: string;
  /** RFC 3339, in the sandbox. */
  readonly at: string;
}

/** GET /warren/leases/events's answer. */
export interface EnvdLeaseEvents {
  readonly events: readonly EnvdLeaseEvent[];
}
