import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import type { SandboxRoute } from "@warren/proto/redis";
import type { ProxyConfig } from "./config.js";
import { type ProxyError, TRAFFIC_TOKEN_HEADER } from "./errors.js";
import type { Upstream } from "./forward.js";
import type { RouteTarget } from "./routing.js";

/** Where an exchange goes (and the route it went by), or why it is refused. */
export type Admission = { readonly upstream: Upstream; readonly route?: SandboxRoute } | { readonly error: ProxyError };
/** An admission, or: the sandbox is paused and may be resumed for this exchange. */
export type Decision = Admission | { readonly resume: SandboxRoute };

// E2B's placeholder in maskRequestHost, replaced by the requested port.
// biome-ignore lint/suspicious/noTemplateCurlyInString: a literal placeholder, not a template
const MASK_PORT_PLACEHOLDER = "${PORT}";

/**
 * What E2B's proxy decides from a route, in its order: the sandbox exists, the traffic token (ports other than
 * envd's of a private sandbox), the sandbox's state (auto-resume when the route allows it and this proxy can), then
 * the upstream address (a mapped port, the relay, a masked Host). Pure: no I/O.
 */
export function admit(
  config: Pick<ProxyConfig, "envdPort" | "relay" | "nodeId">,
  target: RouteTarget,
  route: SandboxRoute | undefined,
  headers: IncomingHttpHeaders,
  canResume: boolean,
): Decision {
  const { sandboxId, port } = target;
  if (route === undefined) return { error: { kind: "sandbox-not-found", sandboxId } };
  const envd = port === config.envdPort;
  if (!envd && !route.public) {
    const token = header(headers, TRAFFIC_TOKEN_HEADER);
    if (!token) return { error: { kind: "traffic-token-missing", sandboxId } };
    if (!tokenMatches(token, route.trafficTokenHash)) return { error: { kind: "traffic-token-invalid", sandboxId } };
  }
  if (route.state !== "running") {
    return route.autoResume && canResume ? { resume: route } : { error: { kind: "sandbox-not-found", sandboxId } };
  }
  const address = upstreamAddress(route, port);
  return {
    upstream: {
      sandboxId,
      exec: route.exec,
      host: address.host,
      port: address.port,
      maskedHost:
        !envd && route.maskRequestHost
          ? route.maskRequestHost.replaceAll(MASK_PORT_PLACEHOLDER, String(port))
          : undefined,
      ...(relayVia(config, route) ? { relayVia: route.nodeAddr } : {}),
    },
    route,
  };
}

/** Whether this route's sandbox is reached through its node agent's relay (PROXY_RELAY). */
export function relayVia(config: Pick<ProxyConfig, "relay" | "nodeId">, route: SandboxRoute): boolean {
  if (config.relay === "off") return false;
  return config.relay === "always" || route.node !== config.nodeId;
}

export function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** Constant-time comparison of SHA-256(token) with the route's hex digest. */
export function tokenMatches(token: string, expectedHex: string): boolean {
  const expected = Buffer.from(expectedHex, "hex");
  const actual = createHash("sha256").update(token).digest();
  return expected.length === actual.length && timingSafeEqual(actual, expected);
}

/** route.ports[P] when the node agent mapped the port elsewhere, else `<sandboxAddr>:P`. */
export function upstreamAddress(route: SandboxRoute, port: number): { host: string; port: number } {
  const mapped = route.ports[String(port)];
  if (mapped) {
    const colon = mapped.lastIndexOf(":");
    const close = mapped.lastIndexOf("]");
    if (colon > close && colon > 0) {
      const mappedPort = Number(mapped.slice(colon + 1));
      if (Number.isInteger(mappedPort) && mappedPort > 0 && mappedPort <= 65535) {
        return { host: unbracket(mapped.slice(0, colon)), port: mappedPort };
      }
    }
    return { host: unbracket(mapped), port };
  }
  return { host: unbracket(route.sandboxAddr), port };
}

function unbracket(host: string): string {
  return host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
}
