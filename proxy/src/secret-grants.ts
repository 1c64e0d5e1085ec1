import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { StartRequestSchema } from "@warren/proto/process/process_pb";

/** Request header (Warren): a one-time secret grant from the api, for this one process.Process/Start. */
export const SECRET_GRANT_HEADER = "warren-secret-grant";
/** The same grant carried as an entry of Start's `envs`, for clients that cannot add headers (the official SDK). */
export const SECRET_GRANT_ENV = "WARREN_SECRET_GRANT";
/** Header (proxy → envd only): base64 of the JSON env var name → secret value; never accepted from a client. */
export const SECRET_ENV_HEADER = "warren-secret-env";
export const START_PATH = "/process.Process/Start";
// A Start request is a few hundred bytes; anything near this is not one worth buffering.
const MAX_START_BODY_BYTES = 1024 * 1024;
const INTERNAL_TOKEN_HEADER = "X-Warren-Internal-Token";

export class SecretGrantError extends Error {
  constructor(
    /** Connect code for the client's end-of-stream error. */
    readonly code: "permission_denied" | "invalid_argument" | "unavailable" | "failed_precondition",
    message: string,
  ) {
    super(message);
    this.name = "SecretGrantError";
  }
}

/** Redeems a grant at the api; the values it answers go to envd in one request header and nowhere else. */
export interface SecretGrantRedeemer {
  redeem(sandboxId: string, grant: string, signal?: AbortSignal): Promise<Record<string, string>>;
}

/** `POST <api>/warren/v1/internal/secret-grants/redeem` with the internal token (PROXY_RESUME_URL/TOKEN). */
export class ControlPlaneGrantRedeemer implements SecretGrantRedeemer {
  private readonly base: string;

  constructor(
    url: string,
    private readonly token: string,
  ) {
    this.base = url.replace(/\/+$/, "");
  }

  async redeem(sandboxId: string, grant: string, signal?: AbortSignal): Promise<Record<string, string>> {
    let response: Response;
    try {
      response = await fetch(`${this.base}/warren/v1/internal/secret-grants/redeem`, {
        method: "POST",
        headers: { "Content-Type": "application/json", [INTERNAL_TOKEN_HEADER]: this.token },
        body: JSON.stringify({ sandboxId, grant }),
        ...(signal ? { signal } : {}),
      });
    } catch (error) {
      throw new SecretGrantError("unavailable", `secret grant could not be redeemed: ${(error as Error).message}`);
    }
    const text = await response.text();
    if (response.status === 403) {
      throw new SecretGrantError("permission_denied", "secret grant is unknown, used, expired or for another sandbox");
    }
    if (!response.ok) throw new SecretGrantError("unavailable", `secret grant redemption answered ${response.status}`);
    const env = (JSON.parse(text) as { env?: unknown }).env;
    if (typeof env !== "object" || env === null)
      throw new SecretGrantError("unavailable", "redemption answer has no env");
    return env as Record<string, string>;
  }
}

/** What the proxy changes in a Start request that carries a grant. */
export interface StartRewrite {
  /** Added to the upstream request (the secret values). */
  readonly headers: readonly [string, string][];
  /** Replaces the client's body (its grant env entry removed); undefined keeps the buffered body as it came. */
  readonly body: Buffer;
}

/**
 * A Start request's body, buffered (Start bodies are small). The grant in the header wins; else an entry
 * `WARREN_SECRET_GRANT` of the process's `envs` (JSON or binary Connect codec) is taken out of the body.
 */
export function findGrant(
  headerGrant: string | undefined,
  contentType: string,
  body: Buffer,
): { grant: string | undefined; body: Buffer } {
  if (headerGrant) return { grant: headerGrant, body };
  if (!body.includes(SECRET_GRANT_ENV)) return { grant: undefined, body };
  if (body.length < 5) throw new SecretGrantError("invalid_argument", "start request body is not a Connect envelope");
  const flags = body[0] as number;
  const length = body.readUInt32BE(1);
  if (flags !== 0 || length !== body.length - 5) {
    throw new SecretGrantError(
      "invalid_argument",
      "a start request carrying a secret grant must be one uncompressed message",
    );
  }
  const message = body.subarray(5);
  let grant: string | undefined;
  let encoded: Buffer;
  if (contentType.startsWith("application/connect+json")) {
    const parsed = JSON.parse(message.toString("utf8")) as { process?: { envs?: Record<string, string> } };
    grant = parsed.process?.envs?.[SECRET_GRANT_ENV];
    if (parsed.process?.envs) delete parsed.process.envs[SECRET_GRANT_ENV];
    encoded = Buffer.from(JSON.stringify(parsed), "utf8");
  } else {
    const parsed = fromBinary(StartRequestSchema, message);
    grant = parsed.process?.envs[SECRET_GRANT_ENV];
    if (parsed.process) delete parsed.process.envs[SECRET_GRANT_ENV];
    encoded = Buffer.from(toBinary(StartRequestSchema, parsed));
  }
  if (grant === undefined) return { grant: undefined, body };
  const head = Buffer.alloc(5);
  head.writeUInt32BE(encoded.length, 1);
  return { grant, body: Buffer.concat([head, encoded]) };
}

/** Reads a request body up to the Start limit. */
export async function readStartBody(req: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of req) {
    total += chunk.length;
    if (total > MAX_START_BODY_BYTES) {
      throw new SecretGrantError("invalid_argument", `start request body is over ${MAX_START_BODY_BYTES} bytes`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** The secret values as the one header envd reads them from. */
export function secretEnvHeader(env: Record<string, string>): [string, string] {
  return [SECRET_ENV_HEADER, Buffer.from(JSON.stringify(env), "utf8").toString("base64")];
}

/** A Connect end-of-stream message carrying an error: how a streaming call fails with a code and message. */
export function connectStreamError(code: string, message: string, metadata?: Record<string, string[]>): Buffer {
  const json = Buffer.from(JSON.stringify({ error: { code, message }, ...(metadata ? { metadata } : {}) }), "utf8");
  const head = Buffer.alloc(5);
  head[0] = 0x02;
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}
