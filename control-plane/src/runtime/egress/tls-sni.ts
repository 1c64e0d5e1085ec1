/**
 * Reads the server name (SNI) from the first TLS record of a connection: a ClientHello (RFC 8446 §4.1.2,
 * RFC 6066 §3). The domain gateway needs only this, before it decides where (and whether) to connect; the
 * handshake itself passes through untouched.
 *
 * Returns `{ name }` (or `{ name: undefined }` for a ClientHello without SNI), `"incomplete"` while the record is
 * still arriving, or `"invalid"` when the bytes are not a TLS ClientHello.
 */
export type SniResult = { readonly name: string | undefined } | "incomplete" | "invalid";

const MAX_RECORD = 16_384 + 2_048;

export function readClientHelloSni(buf: Buffer): SniResult {
  if (buf.length < 5) return buf.length > 0 && buf[0] !== 0x16 ? "invalid" : "incomplete";
  if (buf[0] !== 0x16 || buf[1] !== 0x03) return "invalid";
  const recordLength = buf.readUInt16BE(3);
  if (recordLength > MAX_RECORD) return "invalid";
  if (buf.length < 5 + recordLength) return "incomplete";
  const record = buf.subarray(5, 5 + recordLength);
  try {
    return parseClientHello(record);
  } catch {
    return "invalid";
  }
}

function parseClientHello(hs: Buffer): SniResult {
  // A ClientHello split over several records is legal but never sent by real clients for SNI-sized hellos.
  if (hs[0] !== 0x01) return "invalid";
  const bodyLength = (hs[1]! << 16) | (hs[2]! << 8) | hs[3]!;
  if (bodyLength + 4 > hs.length) return "invalid";
  let at = 4 + 2 + 32; // handshake header, legacy_version, random
  at += 1 + hs[at]!; // session id
  at += 2 + hs.readUInt16BE(at); // cipher suites
  at += 1 + hs[at]!; // compression methods
  if (at === 4 + bodyLength) return { name: undefined }; // no extensions
  const extensionsEnd = at + 2 + hs.readUInt16BE(at);
  at += 2;
  if (extensionsEnd > 4 + bodyLength) return "invalid";
  while (at + 4 <= extensionsEnd) {
    const type = hs.readUInt16BE(at);
    const length = hs.readUInt16BE(at + 2);
    at += 4;
    if (at + length > extensionsEnd) return "invalid";
    if (type === 0x0000) {
      const listEnd = at + 2 + hs.readUInt16BE(at);
      let entry = at + 2;
      while (entry + 3 <= listEnd) {
        const nameType = hs[entry]!;
        const nameLength = hs.readUInt16BE(entry + 1);
        const start = entry + 3;
        if (start + nameLength > listEnd) return "invalid";
        if (nameType === 0) return { name: hs.toString("ascii", start, start + nameLength) };
        entry = start + nameLength;
      }
      return { name: undefined };
    }
    at += length;
  }
  return { name: undefined };
}
