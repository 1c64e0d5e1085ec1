import type { ApiSchema } from "@warren/proto/openapi";
import { type Request, type Response, Router } from "express";
import type { Db } from "../store/db.js";
import { getVisibleSandbox } from "../store/sandboxes.js";
import type { SecretKeyRing } from "../store/secret-box.js";
import {
  createGrant,
  createSecret,
  deleteSecret,
  getSecret,
  listSecrets,
  redeemGrant,
  SecretConflictError,
  type SecretInfo,
  updateSecret,
} from "../store/secrets.js";
import { ApiError, badRequest, sandboxNotFound } from "./errors.js";
import { requireInternalToken } from "./internal.js";
import { parseRequestBody } from "./openapi-requests.js";
import { sandboxId, team } from "./sandboxes.js";

export interface SecretRoutesDeps {
  readonly db: Db;
  /** WARREN_SECRETS_KEYS; without it every secrets path answers 503. */
  readonly secretKeys: SecretKeyRing | undefined;
}

// E2B's documented limits (SecretMetadata) and Warren's own for names and values, where the document's schemas
// cannot say them (bytes rather than characters, names in lower case).
const MAX_NAME_CHARS = 128;
const MAX_VALUE_BYTES = 32 * 1024;
const MAX_METADATA_KEY_BYTES = 128;
const MAX_METADATA_VALUE_BYTES = 1024;
const MAX_METADATA_BYTES = 8192;
const DEFAULT_PAGE = 100;
const MAX_PAGE = 100;
const MAX_SECRETS_PER_GRANT = 32;
const DEFAULT_GRANT_TTL_MS = 60_000;
const INVALID_NAME_CHARS = /[{}\p{Cc}]/u;

function keys(deps: SecretRoutesDeps): SecretKeyRing {
  if (!deps.secretKeys) throw new ApiError(503, "secrets are not configured on this deployment (WARREN_SECRETS_KEYS)");
  return deps.secretKeys;
}

function secretNotFound(ref: string): ApiError {
  return new ApiError(404, `Secret ${ref} not found`);
}

/** E2B's `Secret` schema. */
function secretView(secret: SecretInfo): ApiSchema<"Secret"> {
  return {
    secretID: secret.id,
    name: secret.name,
    currentVersion: secret.version,
    metadata: secret.metadata,
    createdAt: secret.createdAt.toISOString(),
    updatedAt: secret.updatedAt.toISOString(),
  };
}

/** A new secret's name, kept in lower case (the document's pattern has checked its characters). */
function parseName(value: string): string {
  const name = value.toLowerCase();
  // Lower case may be longer; a name is found by a reference of at most MAX_NAME_CHARS UTF-16 units.
  if (name.length > MAX_NAME_CHARS) {
    throw badRequest(
      `secret name ${JSON.stringify(value)} must be 1-${MAX_NAME_CHARS} characters without '{', '}' or control characters`,
    );
  }
  if (name.startsWith("sec_")) throw badRequest(`secret name '${value}' uses the prefix sec_, reserved for secret ids`);
  return name;
}

/** A secret's value: the document says a non-empty string; its bound is in UTF-8 bytes. */
function parseValue(value: string): string {
  const bytes = Buffer.byteLength(value);
  if (bytes > MAX_VALUE_BYTES) throw badRequest(`value is ${bytes} bytes, more than the ${MAX_VALUE_BYTES} allowed`);
  return value;
}

/** E2B's SecretMetadata bounds in bytes (its shape and number of entries are the document's). */
function parseMetadata(value: Readonly<Record<string, string>> | undefined): Record<string, string> | undefined {
  if (value === undefined) return undefined;
  const entries = Object.entries(value);
  let total = 0;
  for (const [key, entry] of entries) {
    if (Buffer.byteLength(key) > MAX_METADATA_KEY_BYTES) {
      throw badRequest(`metadata key '${key.slice(0, 32)}…' is longer than ${MAX_METADATA_KEY_BYTES} bytes`);
    }
    if (Buffer.byteLength(entry) > MAX_METADATA_VALUE_BYTES) {
      throw badRequest(`metadata '${key}' is longer than ${MAX_METADATA_VALUE_BYTES} bytes`);
    }
    total += Buffer.byteLength(key) + Buffer.byteLength(entry);
  }
  if (total > MAX_METADATA_BYTES) throw badRequest(`metadata is ${total} bytes, more than ${MAX_METADATA_BYTES}`);
  return Object.fromEntries(entries);
}

function parseLimit(value: unknown): number {
  if (value === undefined) return DEFAULT_PAGE;
  const limit = Number(value);
  if (typeof value !== "string" || !Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE) {
    throw badRequest(`limit must be an integer from 1 to ${MAX_PAGE}, got ${JSON.stringify(value)}`);
  }
  return limit;
}

function secretRef(req: Request): string {
  const ref = String(req.params.secretID);
  if (ref === "" || ref.length > MAX_NAME_CHARS || INVALID_NAME_CHARS.test(ref)) throw secretNotFound(ref);
  return ref;
}

/** A secret name as an env var name: `openai-api-key` → `OPENAI_API_KEY`. */
export function envNameFor(secretName: string): string {
  const name = secretName.toUpperCase().replace(/[^A-Z0-9_]/g, "_");
  return /^[0-9]/.test(name) ? `_${name}` : name;
}

/** `{secrets: [name…]}` and/or `{env: {ENV_NAME: secret}}` → env var name → secret reference. */
function parseGrantEnv(grant: {
  readonly secrets?: readonly string[];
  readonly env?: Readonly<Record<string, string>>;
}): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of grant.secrets ?? []) env[envNameFor(name)] = name;
  Object.assign(env, grant.env);
  const count = Object.keys(env).length;
  if (count === 0) throw badRequest("a secret grant must name at least one secret (secrets or env)");
  if (count > MAX_SECRETS_PER_GRANT) throw badRequest(`a grant may name at most ${MAX_SECRETS_PER_GRANT} secrets`);
  return env;
}

const objectBody = (value: unknown): Record<string, unknown> => {
  if (value === undefined || value === null) return {};
  if (typeof value !== "object" || Array.isArray(value)) throw badRequest("request body must be a JSON object");
  return value as Record<string, unknown>;
};

/**
 * E2B's Secrets API as `e2b@2.51.0` calls it (`Secret.create/update/getInfo/list/exists/destroy`), scoped to the API
 * key's team (another team's secret is a 404), plus Warren's one-time grants that put secrets into one command:
 * `POST /warren/v1/sandboxes/{id}/secret-grants` `{secrets: [name…]}` or `{env: {ENV: name}}` → 201
 * `{grant, expiresAt}`; the grant goes in the `Warren-Secret-Grant` header of envd's `process.Start` through the
 * proxy, which redeems it (the internal path below) and hands the values to envd for that process only.
 */
export function secretRoutes(deps: SecretRoutesDeps): Router {
  const router = Router();

  router.get("/secrets", async (req: Request, res: Response) => {
    keys(deps);
    const limit = parseLimit(req.query.limit);
    const token = req.query.nextToken;
    if (token !== undefined && typeof token !== "string") throw badRequest("nextToken may be given once");
    const page = await listSecrets(deps.db, team(res).id, limit, token || undefined);
    if (!page) throw badRequest(`nextToken '${String(token).slice(0, 64)}' is not a token this API gave`);
    if (page.nextToken) res.setHeader("X-Next-Token", page.nextToken);
    res.status(200).json(page.secrets.map(secretView));
  });

  router.post("/secrets", async (req: Request, res: Response) => {
    const ring = keys(deps);
    const obj = parseRequestBody("/secrets", "post", req.body);
    const name = parseName(obj.name);
    const value = parseValue(obj.value);
    const metadata = parseMetadata(obj.metadata) ?? {};
    try {
      const secret = await createSecret(deps.db, ring, { teamId: team(res).id, name, value, metadata });
      res.status(201).json(secretView(secret));
    } catch (error) {
      if (error instanceof SecretConflictError) throw new ApiError(409, error.message);
      throw error;
    }
  });

  router.get("/secrets/:secretID", async (req: Request, res: Response) => {
    keys(deps);
    const ref = secretRef(req);
    const secret = await getSecret(deps.db, team(res).id, ref);
    if (!secret) throw secretNotFound(ref);
    res.status(200).json(secretView(secret));
  });

  router.post("/secrets/:secretID", async (req: Request, res: Response) => {
    const ring = keys(deps);
    const ref = secretRef(req);
    const obj = parseRequestBody("/secrets/{secretID}", "post", req.body);
    const value = parseValue(obj.value);
    const metadata = parseMetadata(obj.metadata);
    const secret = await updateSecret(deps.db, ring, { teamId: team(res).id, ref, value, metadata });
    if (!secret) throw secretNotFound(ref);
    res.status(200).json(secretView(secret));
  });

  router.delete("/secrets/:secretID", async (req: Request, res: Response) => {
    keys(deps);
    const ref = secretRef(req);
    if (!(await deleteSecret(deps.db, team(res).id, ref))) throw secretNotFound(ref);
    res.status(204).end();
  });

  router.post("/warren/v1/sandboxes/:sandboxID/secret-grants", async (req: Request, res: Response) => {
    keys(deps);
    const id = sandboxId(req);
    const obj = parseRequestBody("/warren/v1/sandboxes/{sandboxID}/secret-grants", "post", req.body);
    const env = parseGrantEnv(obj);
    const ttlMs = obj.ttlMs ?? DEFAULT_GRANT_TTL_MS;
    const teamId = team(res).id;
    if (!(await getVisibleSandbox(deps.db, teamId, id))) throw sandboxNotFound(id);
    const made = await createGrant(deps.db, { teamId, sandboxId: id, env, ttlMs });
    if ("missing" in made) throw secretNotFound(made.missing);
    res.status(201).json({ grant: made.grant, expiresAt: made.expiresAt.toISOString(), env: Object.keys(env) });
  });

  return router;
}

/**
 * `POST /warren/v1/internal/secret-grants/redeem` `{sandboxId, grant}` (the proxy, with WARREN_INTERNAL_TOKEN): 200
 * `{env}` once per grant; 403 for a grant that is unknown, used, expired or for another sandbox. The values are in
 * this answer only: never logged, never stored in plain text.
 */
export function secretInternalRoutes(deps: SecretRoutesDeps, internalToken: string): Router {
  const router = Router();
  if (!internalToken) return router;
  router.post("/warren/v1/internal/secret-grants/redeem", async (req: Request, res: Response) => {
    requireInternalToken(req, internalToken);
    const ring = keys(deps);
    const obj = objectBody(req.body);
    if (typeof obj.sandboxId !== "string" || typeof obj.grant !== "string" || obj.grant.length > 128) {
      throw badRequest("body must be {sandboxId, grant}");
    }
    const redeemed = await redeemGrant(deps.db, ring, obj.grant, obj.sandboxId);
    if (!redeemed) throw new ApiError(403, "secret grant is unknown, used, expired or for another sandbox");
    res.setHeader("Cache-Control", "no-store");
    res.status(200).json({ env: redeemed.env });
  });
  return router;
}
