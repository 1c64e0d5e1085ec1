import { createHash, timingSafeEqual } from "node:crypto";
import type { SandboxState } from "./state.js";
import type { SandboxUser, UserDirectory } from "./users.js";

/** The user name carried by `Authorization: Basic base64("<name>:")`, if any. */
export function basicAuthUserName(header: string | null | undefined): string | undefined {
  if (!header) return undefined;
  const match = /^Basic\s+(\S+)$/i.exec(header.trim());
  if (!match?.[1]) return undefined;
  const decoded = Buffer.from(match[1], "base64").toString("utf8");
  const colon = decoded.indexOf(":");
  return colon === -1 ? decoded : decoded.slice(0, colon);
}

/** The user a request acts as: the Basic header's user, else the sandbox default. */
export function requestUser(
  authorization: string | null | undefined,
  state: SandboxState,
  users: UserDirectory,
): SandboxUser {
  return users.lookup(basicAuthUserName(authorization) || state.defaultUser);
}

/** Constant-time comparison that does not leak the token's length either. */
export function secretsEqual(given: string, expected: string): boolean {
  const a = createHash("sha256").update(given).digest();
  const b = createHash("sha256").update(expected).digest();
  return timingSafeEqual(a, b);
}

export type FileOperation = "read" | "write";

/**
 * E2B's v1 file URL signature: "v1_" + unpadded standard base64 of
 * SHA-256("<path>:<op>:<user>:<token>[:<expiry>]"), over the raw, unresolved path.
 */
export function fileSignature(
  path: string,
  operation: FileOperation,
  username: string,
  accessToken: string,
  expiresAtUnixSeconds?: number,
): string {
  const parts = [path, operation, username, accessToken];
  if (expiresAtUnixSeconds !== undefined) parts.push(String(expiresAtUnixSeconds));
  const digest = createHash("sha256").update(parts.join(":")).digest("base64");
  return `v1_${digest.replace(/=+$/, "")}`;
}
