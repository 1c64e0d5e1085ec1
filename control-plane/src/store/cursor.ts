/** A page cursor: the last row's timestamp and id (base64url JSON), opaque to clients. */
export function encodeTimeCursor(at: Date, id: string): string {
  return Buffer.from(JSON.stringify([at.toISOString(), id])).toString("base64url");
}

/** The cursor's timestamp and id; undefined when the token is not one `encodeTimeCursor` made. */
export function decodeTimeCursor(token: string): { at: Date; id: string } | undefined {
  try {
    const parsed: unknown = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
    if (!Array.isArray(parsed) || typeof parsed[0] !== "string" || typeof parsed[1] !== "string") return undefined;
    const at = new Date(parsed[0]);
    const year = at.getUTCFullYear();
    // A forged cursor must not reach PostgreSQL with a date or an id it rejects.
    if (Number.isNaN(at.getTime()) || year < 1 || year > 9999) return undefined;
    if (!/^[\x20-\x7e]{1,128}$/.test(parsed[1])) return undefined;
    return { at, id: parsed[1] };
  } catch {
    return undefined;
  }
}
