import { createHash } from "node:crypto";
import type { EnvdEndpoint } from "./envd.js";
import { InvalidArgumentError } from "./errors.js";

export interface FileUrlOpts {
  /** Seconds the signed URL stays valid. */
  useSignatureExpiration?: number;
  user?: string;
}

/**
 * E2B's v1 file URL signature: `v1_` + unpadded base64 of
 * SHA-256(`<path>:<operation>:<user>:<token>[:<expiration>]`).
 */
export function getSignature(opts: {
  path: string;
  operation: "read" | "write";
  user: string | undefined;
  envdAccessToken: string;
  expirationInSeconds?: number;
}): { signature: string; expiration: number | null } {
  const expiration =
    opts.expirationInSeconds === undefined ? null : Math.floor(Date.now() / 1000) + opts.expirationInSeconds;
  const raw =
    expiration === null
      ? `${opts.path}:${opts.operation}:${opts.user ?? ""}:${opts.envdAccessToken}`
      : `${opts.path}:${opts.operation}:${opts.user ?? ""}:${opts.envdAccessToken}:${expiration}`;
  const hash = createHash("sha256").update(raw).digest("base64").replace(/=+$/, "");
  return { signature: `v1_${hash}`, expiration };
}

/**
 * A `/files` URL that needs no headers: signed when the sandbox has an access token. Under header
 * routing the URL carries no sandbox identity (E2B-PROTOCOL §2.2); use host routing to share it.
 */
export async function fileUrl(
  endpoint: EnvdEndpoint,
  path: string | undefined,
  operation: "read" | "write",
  opts: FileUrlOpts,
): Promise<string> {
  const url = new URL(`${endpoint.url}/files`);
  if (opts.user !== undefined) url.searchParams.set("username", opts.user);
  if (path !== undefined) url.searchParams.set("path", path);
  if (endpoint.accessToken) {
    const { signature, expiration } = getSignature({
      path: path ?? "",
      operation,
      user: opts.user,
      envdAccessToken: endpoint.accessToken,
      ...(opts.useSignatureExpiration !== undefined ? { expirationInSeconds: opts.useSignatureExpiration } : {}),
    });
    url.searchParams.set("signature", signature);
    if (expiration !== null) url.searchParams.set("signature_expiration", String(expiration));
  } else if (opts.useSignatureExpiration !== undefined) {
    throw new InvalidArgumentError("Signature expiration can be used only when sandbox is created as secured.");
  }
  return url.toString();
}
