import type { IncomingMessage, ServerResponse } from "node:http";
import { secretsEqual } from "../auth.js";
import type { EnvdContext } from "../context.js";
import { invalidArgument, unauthenticated } from "../errors.js";
import { ENVD_VERSION } from "../version.js";
import { readJsonBody } from "./body.js";

/** The fields of POST /init that envd acts on; E2B's other fields are accepted and ignored. */
export interface InitRequest {
  envVars?: Record<string, string>;
  accessToken?: string;
  timestamp?: Date;
  defaultUser?: string;
  defaultWorkdir?: string;
}

export function parseInitRequest(body: unknown): InitRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw invalidArgument("init body must be a JSON object");
  }
  const input = body as Record<string, unknown>;
  const request: InitRequest = {};
  if (input.envVars !== undefined && input.envVars !== null) {
    if (typeof input.envVars !== "object" || Array.isArray(input.envVars)) {
      throw invalidArgument("envVars must be an object of strings");
    }
    const vars: Record<string, string> = {};
    for (const [name, value] of Object.entries(input.envVars as Record<string, unknown>)) {
      if (typeof value !== "string") throw invalidArgument(`envVars.${name} must be a string`);
      if (name === "" || name.includes("=") || name.includes("\0"))
        throw invalidArgument(`invalid env var name '${name}'`);
      vars[name] = value;
    }
    request.envVars = vars;
  }
  for (const field of ["accessToken", "defaultUser", "defaultWorkdir"] as const) {
    const value = input[field];
    if (value === undefined || value === null) continue;
    if (typeof value !== "string") throw invalidArgument(`${field} must be a string`);
    request[field] = value;
  }
  if (input.timestamp !== undefined && input.timestamp !== null) {
    const when = typeof input.timestamp === "string" ? new Date(input.timestamp) : undefined;
    if (!when || Number.isNaN(when.getTime())) throw invalidArgument("timestamp must be an RFC 3339 date-time");
    request.timestamp = when;
  }
  return request;
}

/**
 * POST /init: the node agent configures a fresh (or resumed) sandbox. Allowed when no token
 * is set yet (first boot) or when the caller presents the current one. envd never sets the
 * clock: a namespace sandbox shares the host's clock, and only a microVM guest may set its own.
 */
export async function handleInit(req: IncomingMessage, res: ServerResponse, ctx: EnvdContext): Promise<void> {
  const { state, users } = ctx;
  if (state.accessToken !== undefined) {
    const given = req.headers["x-access-token"];
    if (typeof given !== "string" || !secretsEqual(given, state.accessToken)) {
      throw unauthenticated("unauthorized access, please provide a valid access token or method signing if supported");
    }
  }
  const init = parseInitRequest(await readJsonBody(req));
  if (init.defaultUser !== undefined && init.defaultUser !== "") users.lookup(init.defaultUser);
  if (init.envVars) state.replaceUserEnv(init.envVars);
  if (init.accessToken !== undefined) state.accessToken = init.accessToken === "" ? undefined : init.accessToken;
  if (init.defaultUser) state.defaultUser = init.defaultUser;
  if (init.defaultWorkdir !== undefined) state.defaultWorkdir = init.defaultWorkdir || undefined;
  ctx.log.info("sandbox initialised", {
    envVarCount: init.envVars ? Object.keys(init.envVars).length : undefined,
    defaultUser: state.defaultUser,
    secured: state.accessToken !== undefined,
  });
  res.writeHead(204, { "X-Envd-Version": ENVD_VERSION, "Cache-Control": "no-store" });
  res.end();
}
