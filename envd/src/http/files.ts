import type { IncomingMessage, ServerResponse } from "node:http";
import { ENVD_FILES_QUERY } from "@warren/proto/envd-http";
import { type FileOperation, fileSignature, secretsEqual } from "../auth.js";
import type { EnvdContext } from "../context.js";
import { invalidArgument, unauthenticated } from "../errors.js";
import type { SandboxUser } from "../users.js";
import { serveDownload } from "./files-download.js";
import { receiveUpload } from "./files-upload.js";
import { sendError, sendJsonError } from "./respond.js";

/** The /files query, parsed once at the edge. */
export interface FilesQuery {
  /** Raw (unresolved) `path`; also what a URL signature covers. */
  readonly path: string | undefined;
  readonly username: string | undefined;
  readonly signature: string | undefined;
  readonly signatureExpiration: number | undefined;
}

export function parseFilesQuery(search: URLSearchParams): FilesQuery {
  const expiration = search.get(ENVD_FILES_QUERY.signatureExpiration);
  if (expiration !== null && !/^-?\d+$/.test(expiration)) {
    throw invalidArgument(`signature_expiration must be an integer (unix seconds), got '${expiration}'`);
  }
  return {
    path: search.get(ENVD_FILES_QUERY.path) ?? undefined,
    username: search.get(ENVD_FILES_QUERY.username) ?? undefined,
    signature: search.get(ENVD_FILES_QUERY.signature) ?? undefined,
    signatureExpiration: expiration === null ? undefined : Number(expiration),
  };
}

/**
 * /files auth (E2B-PROTOCOL.md §4.1, §4.3): nothing without an access token; otherwise an
 * X-Access-Token header must match, or else a valid, unexpired URL signature is required.
 */
export function authorizeFiles(
  header: string | string[] | undefined,
  query: FilesQuery,
  operation: FileOperation,
  accessToken: string | undefined,
  nowSeconds = Math.floor(Date.now() / 1000),
): void {
  if (accessToken === undefined) return;
  const given = Array.isArray(header) ? header[0] : header;
  if (given) {
    if (!secretsEqual(given, accessToken)) throw unauthenticated("access token present in header but does not match");
    return;
  }
  if (query.signature === undefined) throw unauthenticated("missing signature query parameter");
  const expected = fileSignature(
    query.path ?? "",
    operation,
    query.username ?? "",
    accessToken,
    query.signatureExpiration,
  );
  if (!secretsEqual(query.signature, expected)) throw unauthenticated("invalid signature");
  if (query.signatureExpiration !== undefined && query.signatureExpiration < nowSeconds) {
    throw unauthenticated("signature is already expired");
  }
}

/** The requested account (`username`), else the sandbox default; unknown names are 401 as in E2B. */
export function fileUser(ctx: EnvdContext, username: string | undefined): SandboxUser {
  const name = username ?? ctx.state.defaultUser;
  const user = ctx.users.find(name);
  if (!user) throw unauthenticated(`error looking up user '${name}': user: unknown user ${name}`);
  return user;
}

/** GET and POST /files; server.ts routes here before its generic token check. */
export async function handleFiles(req: IncomingMessage, res: ServerResponse, ctx: EnvdContext): Promise<void> {
  if (req.method !== "GET" && req.method !== "POST") {
    res.setHeader("Allow", "GET, POST");
    sendJsonError(res, 405, `method ${req.method} is not allowed on /files`);
    return;
  }
  try {
    const query = parseFilesQuery(new URL(req.url ?? "/", "http://envd").searchParams);
    const operation: FileOperation = req.method === "GET" ? "read" : "write";
    authorizeFiles(req.headers["x-access-token"], query, operation, ctx.state.accessToken);
    const user = fileUser(ctx, query.username);
    if (operation === "read") await serveDownload(req, res, user, query.path ?? "");
    else await receiveUpload(req, res, user, query.path);
  } catch (error) {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    sendError(res, error);
    const status = res.statusCode;
    if (status >= 500) {
      ctx.log.warn("/files request failed", { method: req.method, status, error: (error as Error).message });
    }
  }
}
