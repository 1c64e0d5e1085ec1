import type { IncomingMessage, ServerResponse } from "node:http";
import {
  ENVD_ACCESS_TOKEN_HEADER,
  ENVD_VERSION_HEADER,
  EnvdInitBodyError,
  type EnvdInitRequest,
  parseEnvdInitBody,
} from "@warren/proto/envd-http";
import { secretsEqual } from "../auth.js";
import type { EnvdContext } from "../context.js";
import { invalidArgument, unauthenticated } from "../errors.js";
import { ENVD_VERSION } from "../version.js";
import { readJsonBody } from "./body.js";

/** The fields of POST /init that envd acts on; E2B's other fields are accepted and ignored. */
export type InitRequest = EnvdInitRequest;

/** The /init body as the contract (`@warren/proto/envd-http`) parses it; a refusal is envd's `invalid_argument`. */
export function parseInitRequest(body: unknown): InitRequest {
  try {
    return parseEnvdInitBody(body);
  } catch (error) {
    if (error instanceof EnvdInitBodyError) throw invalidArgument(error.message);
    throw error;
  }
}

/**
 * POST /init: the node agent configures a fresh (or resumed) sandbox. Allowed when no token
 * is set yet (first boot) or when the caller presents the current one. envd never sets the
 * clock: a namespace sandbox shares the host's clock, and only a microVM guest may set its own.
 */
export async function handleInit(req: IncomingMessage, res: ServerResponse, ctx: EnvdContext): Promise<void> {
  const { state, users } = ctx;
  if (state.accessToken !== undefined) {
    const given = req.headers[ENVD_ACCESS_TOKEN_HEADER.toLowerCase()];
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
  res.writeHead(204, { [ENVD_VERSION_HEADER]: ENVD_VERSION, "Cache-Control": "no-store" });
  res.end();
}
