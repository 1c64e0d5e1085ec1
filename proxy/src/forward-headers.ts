import type { IncomingMessage } from "node:http";
import type { Upstream } from "./forward.js";

/*
 * Which headers cross the proxy, each way: hop-by-hop headers (RFC 9110 §7.6.1) and those a `Connection:` header
 * names stop here, the ones only this proxy may set (secret grants) never come from a client, and Host is masked
 * when the route asks for it.
 */

/** Hop-by-hop headers (RFC 9110 §7.6.1) and the ones this proxy answers itself. */
// warren-secret-*: only this proxy may hand secrets to envd (secret-grants.ts), never a client.
// transfer-encoding: the request body is re-framed by the upstream client (chunked when its length is unknown).
export const REQUEST_DROP = new Set([
  "transfer-encoding",
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "upgrade",
  "expect",
  "warren-secret-grant",
  "warren-secret-env",
]);
export const REWRITE_REQUEST_DROP = new Set([...REQUEST_DROP, "content-length"]);
export const UPGRADE_REQUEST_DROP = new Set([
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "expect",
  "warren-secret-grant",
  "warren-secret-env",
]);
export const RESPONSE_DROP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "trailer",
  "upgrade",
]);

/** Raw header names and values (Node keeps them as latin1 bytes) as strings. */
export function latin1Headers(raw: readonly Buffer[]): string[] {
  const out = new Array<string>(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw[i]!.toString("latin1");
  return out;
}

/**
 * Copies raw request headers minus `drop`, with Host masked when the route asks for it and `X-Forwarded-Proto` set
 * by this proxy when the upstream is told the client's scheme.
 */
export function requestHeaders(raw: readonly string[], drop: ReadonlySet<string>, upstream: Upstream): string[] {
  const out: string[] = [];
  const extraDrop = connectionListed(raw);
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if (drop.has(lower) || extraDrop?.has(lower)) continue;
    if (lower === "host" && upstream.maskedHost !== undefined) {
      out.push("Host", upstream.maskedHost, "X-Forwarded-Host", raw[i + 1]!);
      continue;
    }
    if (lower === "x-forwarded-host" && upstream.maskedHost !== undefined) continue;
    if (lower === "x-forwarded-proto" && upstream.forwardedProto !== undefined) continue;
    out.push(name, raw[i + 1]!);
  }
  if (upstream.forwardedProto !== undefined) out.push("X-Forwarded-Proto", upstream.forwardedProto);
  return out;
}

/** Copies raw response headers minus `drop` and what `Connection:` names. */
export function responseHeaders(raw: readonly string[], drop: ReadonlySet<string>): string[] {
  const out: string[] = [];
  const extraDrop = connectionListed(raw);
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (drop.has(lower) || extraDrop?.has(lower)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

/** Headers a `Connection:` header names as hop-by-hop (besides the usual keep-alive/close/upgrade). */
function connectionListed(raw: readonly string[]): Set<string> | undefined {
  let listed: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.length !== 10 || raw[i]!.toLowerCase() !== "connection") continue;
    for (const token of raw[i + 1]!.split(",")) {
      const name = token.trim().toLowerCase();
      if (name === "" || name === "keep-alive" || name === "close" || name === "upgrade") continue;
      listed ??= new Set();
      listed.add(name);
    }
  }
  return listed;
}

/** An upgraded exchange's status line and headers, written to the client socket as they came. */
export function statusHead(res: IncomingMessage, headers: readonly string[]): string {
  let head = `HTTP/1.1 ${res.statusCode} ${res.statusMessage}\r\n`;
  for (let i = 0; i < headers.length; i += 2) head += `${headers[i]}: ${headers[i + 1]}\r\n`;
  return `${head}\r\n`;
}
