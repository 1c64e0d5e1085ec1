import { type IncomingHttpHeaders, type ServerResponse, STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import type { RoutingFailure } from "./routing.js";

/**
 * Every answer the proxy gives itself instead of the sandbox's, as a value. Status codes,
 * JSON field order and messages are E2B's (E2B-PROTOCOL.md §2.5): clients read `message`
 * and the status (e.g. the SDK's isRunning() is `status != 502`).
 */
export type ProxyError =
  | { readonly kind: "sandbox-not-found"; readonly sandboxId: string }
  | { readonly kind: "port-closed"; readonly sandboxId: string; readonly port: number }
  | { readonly kind: "traffic-token-missing"; readonly sandboxId: string }
  | { readonly kind: "traffic-token-invalid"; readonly sandboxId: string }
  | { readonly kind: "resume-forbidden"; readonly sandboxId: string }
  | { readonly kind: "still-transitioning"; readonly sandboxId: string }
  | { readonly kind: "sandbox-limit"; readonly sandboxId: string; readonly message: string }
  | { readonly kind: "too-many-connections"; readonly sandboxId: string; readonly limit: number }
  | { readonly kind: "control-only-path"; readonly path: string }
  | { readonly kind: "api-unreachable" };

export const TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token";

interface Rendered {
  readonly status: number;
  readonly title: string;
  /** Field order matters: E2B's Go structs fix it and byte-comparing clients see it. */
  readonly body: Record<string, string | number>;
  readonly explanation: string;
}

function describe(error: ProxyError): Rendered {
  switch (error.kind) {
    case "sandbox-not-found":
      return {
        status: 502,
        title: "Sandbox not found",
        body: { sandboxId: error.sandboxId, message: "The sandbox was not found", code: 502 },
        explanation: `The sandbox ${error.sandboxId} is not running: it was killed, it timed out, or it is paused.`,
      };
    case "port-closed":
      return {
        status: 502,
        title: "Port closed",
        body: {
          sandboxId: error.sandboxId,
          message: "The sandbox is running but port is not open",
          port: error.port,
          code: 502,
        },
        explanation: `The sandbox ${error.sandboxId} is running, but nothing answers on port ${error.port}.`,
      };
    case "traffic-token-missing":
      return {
        status: 403,
        title: "Missing traffic access token",
        body: {
          sandboxId: error.sandboxId,
          message: `Sandbox is secured with traffic access token. Token header '${TRAFFIC_TOKEN_HEADER}' is missing`,
          code: 403,
        },
        explanation: `The sandbox ${error.sandboxId} only accepts requests carrying the ${TRAFFIC_TOKEN_HEADER} header.`,
      };
    case "traffic-token-invalid":
      return {
        status: 403,
        title: "Invalid traffic access token",
        body: {
          sandboxId: error.sandboxId,
          message: `Sandbox is secured with traffic access token. Provided token in header '${TRAFFIC_TOKEN_HEADER}' is invalid`,
          code: 403,
        },
        explanation: `The ${TRAFFIC_TOKEN_HEADER} header does not match the sandbox ${error.sandboxId}.`,
      };
    case "resume-forbidden":
      return {
        status: 403,
        title: "Unable to resume sandbox",
        body: {
          sandboxId: error.sandboxId,
          message:
            "This sandbox can't be resumed with the credentials provided. Check your access token and try again.",
          code: 403,
        },
        explanation: `The sandbox ${error.sandboxId} is paused and these credentials cannot resume it.`,
      };
    case "still-transitioning":
      return {
        status: 409,
        title: "Sandbox still transitioning",
        body: {
          sandboxId: error.sandboxId,
          message: "The sandbox is still transitioning. Try again in a moment.",
          code: 409,
        },
        explanation: `The sandbox ${error.sandboxId} is pausing or resuming. Try again in a moment.`,
      };
    case "sandbox-limit":
      return {
        status: 429,
        title: "Sandbox limit reached",
        body: { sandboxId: error.sandboxId, message: error.message || "Sandbox limit reached", code: 429 },
        explanation: error.message || "Sandbox limit reached",
      };
    case "too-many-connections":
      return {
        status: 429,
        title: "Too many connections",
        body: {
          sandboxId: error.sandboxId,
          message: `The sandbox has too many concurrent incoming connections (limit: ${error.limit})`,
          code: 429,
          connectionLimit: error.limit,
        },
        explanation: `The sandbox ${error.sandboxId} already has ${error.limit} open connections (limit: ${error.limit}).`,
      };
    case "api-unreachable":
      return {
        status: 502,
        title: "API unreachable",
        // The api's own error shape ({code, message}), since the client asked the api.
        body: { code: 502, message: "The API is not reachable through this proxy" },
        explanation: "The proxy could not reach Warren's API.",
      };
    case "control-only-path":
      return {
        status: 404,
        title: "Endpoint not available",
        body: {
          message: "This endpoint is reserved for the E2B control plane and is not reachable through the sandbox URL",
          path: error.path,
          code: 404,
        },
        explanation: `${error.path} is reserved for the control plane and is not reachable through the sandbox URL.`,
      };
  }
}

export function errorStatus(error: ProxyError): number {
  return describe(error).status;
}

/** JSON as Go's encoding/json writes it (it escapes <, >, & and the JS line separators). */
export function goJson(value: unknown): string {
  return JSON.stringify(value).replace(
    /[<>&\u2028\u2029]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

const BROWSER_UA = /mozilla|chrome|safari|firefox|edge|opera|msie/i;

/**
 * HTML only for a page a person is looking at: an explicit navigation, or a browser (or an
 * `Accept: text/html` client) that is not a script asking for data. Everything else gets JSON.
 */
export function wantsHtml(headers: IncomingHttpHeaders): boolean {
  const mode = headers["sec-fetch-mode"];
  if (mode === "navigate") return true;
  if (mode) return false;
  if (headers["x-requested-with"]) return false;
  const accept = headers.accept ?? "";
  if (accept.includes("application/json")) return false;
  return accept.includes("text/html") || BROWSER_UA.test(headers["user-agent"] ?? "");
}

function escapeHtml(text: string): string {
  return text.replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] ?? c,
  );
}

function htmlPage(rendered: Rendered, host: string): string {
  const status = `${rendered.status} ${STATUS_CODES[rendered.status] ?? ""}`;
  return `<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(rendered.title)} · Warren</title>
<style>body{font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;color:#222}code{background:#f3f3f3;padding:0 .25rem}small{color:#777}</style>
</head>
<body>
<h1 id="title">${escapeHtml(rendered.title)}</h1>
<p>${escapeHtml(rendered.explanation)}</p>
<p><small>${escapeHtml(status)} · <code>${escapeHtml(host)}</code></small></p>
</body>
</html>
`;
}

interface Payload {
  readonly status: number;
  readonly contentType: string;
  readonly body: string;
}

function payload(error: ProxyError, headers: IncomingHttpHeaders): Payload {
  const rendered = describe(error);
  if (wantsHtml(headers)) {
    return {
      status: rendered.status,
      contentType: "text/html; charset=utf-8",
      body: htmlPage(rendered, headers.host ?? ""),
    };
  }
  return { status: rendered.status, contentType: "application/json; charset=utf-8", body: goJson(rendered.body) };
}

/** Answers an HTTP request with the proxy's own error page. */
export function sendProxyError(res: ServerResponse, headers: IncomingHttpHeaders, error: ProxyError): number {
  const { status, contentType, body } = payload(error, headers);
  res.writeHead(status, {
    "Content-Type": contentType,
    "Content-Length": Buffer.byteLength(body),
    // The proxy answers for the sandbox, so without this a browser would hide the answer from scripts.
    "Access-Control-Allow-Origin": "*",
  });
  res.end(body);
  return status;
}

/** Answers a bad routing input the way Go's http.Error does: plain text and a newline. */
export function sendRoutingFailure(res: ServerResponse, failure: RoutingFailure): number {
  const body = `${failure}\n`;
  res.writeHead(400, {
    "Content-Type": "text/plain; charset=utf-8",
    "X-Content-Type-Options": "nosniff",
    "Content-Length": Buffer.byteLength(body),
  });
  res.end(body);
  return 400;
}

/** The same answers on a raw socket, for upgrade requests that never became a ServerResponse. */
export function writeSocketError(
  socket: Duplex,
  headers: IncomingHttpHeaders,
  error: ProxyError | RoutingFailure,
): number {
  const { status, contentType, body } =
    typeof error === "string"
      ? { status: 400, contentType: "text/plain; charset=utf-8", body: `${error}\n` }
      : payload(error, headers);
  const extra =
    typeof error === "string" ? "X-Content-Type-Options: nosniff\r\n" : "Access-Control-Allow-Origin: *\r\n";
  if (socket.writable) {
    socket.end(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: ${contentType}\r\n${extra}` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  } else {
    socket.destroy();
  }
  return status;
}
