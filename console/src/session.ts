/**
 * Who is signed in. The secret lives in sessionStorage only: it dies with the tab, is never written to a URL,
 * a cookie or localStorage, and is sent only in request headers (X-API-Key / X-Admin-Token).
 */
export type Credential =
  | { readonly kind: "apiKey"; readonly secret: string }
  | { readonly kind: "admin"; readonly secret: string };

const STORAGE_KEY = "warren.console.credential";

export function loadCredential(storage: Pick<Storage, "getItem"> = sessionStorage): Credential | undefined {
  const raw = storage.getItem(STORAGE_KEY);
  if (!raw) return undefined;
  try {
    const parsed = JSON.parse(raw) as { kind?: unknown; secret?: unknown };
    if ((parsed.kind === "apiKey" || parsed.kind === "admin") && typeof parsed.secret === "string" && parsed.secret) {
      return { kind: parsed.kind, secret: parsed.secret };
    }
  } catch {
    // A value this console did not write: treat it as signed out.
  }
  return undefined;
}

export function saveCredential(credential: Credential, storage: Pick<Storage, "setItem"> = sessionStorage): void {
  storage.setItem(STORAGE_KEY, JSON.stringify(credential));
}

export function clearCredential(storage: Pick<Storage, "removeItem"> = sessionStorage): void {
  storage.removeItem(STORAGE_KEY);
}

/** The header that carries the credential on every api request. */
export function authHeaders(credential: Credential): Record<string, string> {
  return credential.kind === "apiKey" ? { "X-API-Key": credential.secret } : { "X-Admin-Token": credential.secret };
}
