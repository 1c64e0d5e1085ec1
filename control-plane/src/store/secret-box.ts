import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";

/** One AES-256 key of WARREN_SECRETS_KEYS, named so a stored value says which key sealed it. */
export interface SecretKey {
  readonly id: string;
  readonly key: Buffer;
}

/** A value sealed with AES-256-GCM: the id of the key that sealed it and `iv ‖ tag ‖ ciphertext`. */
export interface SealedValue {
  readonly keyId: string;
  readonly blob: Buffer;
}

export class SecretKeyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SecretKeyError";
  }
}

const IV_BYTES = 12;
const TAG_BYTES = 16;
const KEY_ID = /^[A-Za-z0-9_-]{1,32}$/;

/**
 * The deployment's secret keys. The first seals every new value; any of them opens a value it sealed, so a key is
 * rotated by putting a new one first and dropping the old one once `rewrap` has moved every row to the new one.
 * Values are bound to their row (`context`: team, secret id): a ciphertext copied into another row does not open.
 */
export class SecretKeyRing {
  private readonly byId: ReadonlyMap<string, Buffer>;

  constructor(private readonly keys: readonly SecretKey[]) {
    if (keys.length === 0) throw new SecretKeyError("a secret key ring needs at least one key");
    this.byId = new Map(keys.map((k) => [k.id, k.key]));
  }

  /** The id of the key new values are sealed with. */
  get currentKeyId(): string {
    return (this.keys[0] as SecretKey).id;
  }

  seal(plaintext: string, context: string): SealedValue {
    const current = this.keys[0] as SecretKey;
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv("aes-256-gcm", current.key, iv);
    cipher.setAAD(Buffer.from(context, "utf8"));
    const body = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()]);
    return { keyId: current.id, blob: Buffer.concat([iv, cipher.getAuthTag(), body]) };
  }

  open(sealed: SealedValue, context: string): string {
    const key = this.byId.get(sealed.keyId);
    if (!key) throw new SecretKeyError(`secret sealed with key '${sealed.keyId}', which WARREN_SECRETS_KEYS lacks`);
    if (sealed.blob.length < IV_BYTES + TAG_BYTES) throw new SecretKeyError("sealed secret is truncated");
    const decipher = createDecipheriv("aes-256-gcm", key, sealed.blob.subarray(0, IV_BYTES));
    decipher.setAAD(Buffer.from(context, "utf8"));
    decipher.setAuthTag(sealed.blob.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
    try {
      return Buffer.concat([decipher.update(sealed.blob.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString(
        "utf8",
      );
    } catch {
      throw new SecretKeyError(`secret sealed with key '${sealed.keyId}' does not open (wrong key or altered row)`);
    }
  }
}

/**
 * WARREN_SECRETS_KEYS: comma-separated `<id>:<base64 of 32 bytes>`, newest first. Empty: no key ring (the secrets
 * API answers 503). Errors name the entry, never the key material.
 */
export function parseSecretKeys(raw: string): SecretKeyRing | undefined {
  const entries = raw
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry !== "");
  if (entries.length === 0) return undefined;
  const keys: SecretKey[] = [];
  for (const [index, entry] of entries.entries()) {
    const colon = entry.indexOf(":");
    const id = colon < 0 ? "" : entry.slice(0, colon);
    if (!KEY_ID.test(id)) {
      throw new SecretKeyError(
        `WARREN_SECRETS_KEYS entry ${index + 1} must be <id>:<base64 key> with id [A-Za-z0-9_-]{1,32}`,
      );
    }
    const key = Buffer.from(entry.slice(colon + 1), "base64");
    if (key.length !== 32) {
      throw new SecretKeyError(`WARREN_SECRETS_KEYS key '${id}' must be 32 bytes in base64, got ${key.length} bytes`);
    }
    if (keys.some((k) => k.id === id)) throw new SecretKeyError(`WARREN_SECRETS_KEYS names key '${id}' twice`);
    keys.push({ id, key });
  }
  return new SecretKeyRing(keys);
}
