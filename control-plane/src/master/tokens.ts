import { createHash, createHmac, randomBytes } from "node:crypto";

/**
 * Sandbox tokens are derived, not stored: token = HMAC(secret, kind:sandboxId:nonce). PostgreSQL keeps only
 * the nonce and the token's hash, so a database dump alone reveals no token, while connect/resume can hand out
 * the same token again (E2B clients keep using the token they got at create).
 */
export class TokenIssuer {
  constructor(private readonly secret: string) {
    if (secret.length < 16) throw new Error("the token secret must be at least 16 characters");
  }

  newNonce(): string {
    return randomBytes(16).toString("hex");
  }

  envdToken(sandboxId: string, nonce: string): string {
    return this.derive("envd", sandboxId, nonce);
  }

  trafficToken(sandboxId: string, nonce: string): string {
    return this.derive("traffic", sandboxId, nonce);
  }

  private derive(kind: string, sandboxId: string, nonce: string): string {
    return createHmac("sha256", this.secret).update(`${kind}:${sandboxId}:${nonce}`).digest("base64url");
  }
}

export function sha256Hex(value: string): string {
  return createHash("sha256").update(value).digest("hex");
}

const ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

/** E2B-shaped sandbox id: 20 characters of [a-z0-9]. */
export function newSandboxId(): string {
  const bytes = randomBytes(20);
  let id = "i";
  for (let i = 1; i < 20; i++) id += ID_ALPHABET[(bytes[i] ?? 0) % ID_ALPHABET.length];
  return id;
}
