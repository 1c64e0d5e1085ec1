import { isIP } from "node:net";
import { ENVD_INIT_PATH } from "@warren/proto/envd-http";
import { isSandboxId } from "@warren/proto/redis";

/** Which sandbox port a request is for, as E2B clients address it (E2B-PROTOCOL.md §2.4). */
export interface RouteTarget {
  readonly sandboxId: string;
  readonly port: number;
  readonly via: "host" | "headers";
}

/** E2B's plain-text 400 reasons, exactly as its proxy words them. */
export type RoutingFailure = "missing header" | "Invalid host" | "Invalid sandbox ID" | "Invalid sandbox port";

export interface RoutingRules {
  /** Sandbox domains; empty accepts any domain after the first label. */
  readonly domains: readonly string[];
  /** Extra host names (besides localhost, IP literals and sandbox.*) that route by headers. */
  readonly sharedHosts: readonly string[];
}

export const SANDBOX_ID_HEADER = "e2b-sandbox-id";
export const SANDBOX_PORT_HEADER = "e2b-sandbox-port";
const SHARED_HOST_PREFIX = "sandbox.";
const API_HOST_PREFIX = "api.";

export class Router {
  private readonly domains: ReadonlySet<string>;
  private readonly sharedHosts: ReadonlySet<string>;

  constructor(rules: RoutingRules) {
    this.domains = new Set(rules.domains);
    this.sharedHosts = new Set(rules.sharedHosts);
  }

  /**
   * Finds the sandbox and port a request addresses: by the routing headers on a shared host,
   * else by a `<port>-<sandboxId>.<domain>` Host. Returns the 400 reason when neither works.
   */
  resolve(
    hostHeader: string | undefined,
    idHeader: string | undefined,
    portHeader: string | undefined,
  ): RouteTarget | RoutingFailure {
    const host = requestHostname(hostHeader ?? "");
    if ((idHeader || portHeader) && this.isSharedHost(host)) {
      if (!idHeader || !portHeader) return "missing header";
      const port = parsePort(portHeader);
      if (port === undefined) return "Invalid sandbox port";
      if (!validSandboxId(idHeader)) return "Invalid sandbox ID";
      return { sandboxId: idHeader, port, via: "headers" };
    }
    const dot = host.indexOf(".");
    if (dot <= 0) return "Invalid host";
    if (this.domains.size > 0 && !this.domains.has(host.slice(dot + 1))) return "Invalid host";
    const parts = host.slice(0, dot).split("-");
    if (parts.length < 2) return "Invalid host";
    // Legacy `<port>-<id>-<clientId>` hosts: like E2B, only the first two parts count.
    const port = parsePort(parts[0]!);
    if (port === undefined) return "Invalid sandbox port";
    const sandboxId = parts[1]!;
    if (!validSandboxId(sandboxId)) return "Invalid sandbox ID";
    return { sandboxId, port, via: "host" };
  }

  /**
   * `api.<domain>` (a sandbox domain; any when none is configured): the api's host in E2B's layout. It can never
   * be a sandbox host, which needs a `<port>-<id>` first label.
   */
  isApiHost(hostHeader: string | undefined): boolean {
    const host = requestHostname(hostHeader ?? "");
    if (!host.startsWith(API_HOST_PREFIX) || host.length === API_HOST_PREFIX.length) return false;
    return this.domains.size === 0 || this.domains.has(host.slice(API_HOST_PREFIX.length));
  }

  private isSharedHost(host: string): boolean {
    return (
      host === "localhost" ||
      isIP(host) !== 0 ||
      (host.startsWith(SHARED_HOST_PREFIX) && host.length > SHARED_HOST_PREFIX.length) ||
      this.sharedHosts.has(host)
    );
  }
}

/** The host name of a Host header value: lowercased, without port, brackets or a trailing dot. */
export function requestHostname(host: string): string {
  let name = host;
  if (name.startsWith("[")) {
    const end = name.indexOf("]");
    name = end > 0 ? name.slice(1, end) : name;
  } else {
    const colon = name.indexOf(":");
    // More than one colon is a bare IPv6 literal, which has no port.
    if (colon >= 0 && name.indexOf(":", colon + 1) < 0) name = name.slice(0, colon);
  }
  if (name.endsWith(".")) name = name.slice(0, -1);
  return name.toLowerCase();
}

function parsePort(text: string): number | undefined {
  if (!/^\d{1,5}$/.test(text)) return undefined;
  const port = Number(text);
  return port >= 1 && port <= 65535 ? port : undefined;
}

/** The contract's rule (`@warren/proto/redis`): lowercase alphanumerics, so `<port>-<id>` hosts parse. */
function validSandboxId(id: string): boolean {
  return isSandboxId(id);
}

/**
 * envd routes only the control plane may call (E2B's `x-internal` set plus /upgrade). Checked on
 * the decoded, cleaned path, so `/init/`, `//init` and `/files/../init` are refused too.
 */
const CONTROL_ONLY_PATHS: ReadonlySet<string> = new Set([
  ENVD_INIT_PATH,
  "/freeze",
  "/unfreeze",
  "/collapse",
  "/fsfreeze",
  "/fsthaw",
  "/upgrade",
]);

/** Returns the decoded path when `url` addresses a control-only envd route, else undefined. */
export function controlOnlyPath(url: string): string | undefined {
  let path = url;
  if (!path.startsWith("/")) {
    // absolute-form request target: http://host/path
    const scheme = path.indexOf("://");
    if (scheme >= 0) {
      const slash = path.indexOf("/", scheme + 3);
      path = slash >= 0 ? path.slice(slash) : "/";
    } else {
      path = `/${path}`;
    }
  }
  const query = path.search(/[?#]/);
  if (query >= 0) path = path.slice(0, query);
  if (!/[%.]|\/\//.test(path)) {
    // Common case: nothing to decode or clean but a trailing slash.
    const trimmed = path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path;
    return CONTROL_ONLY_PATHS.has(trimmed) ? path : undefined;
  }
  let decoded = path;
  if (path.includes("%")) {
    try {
      decoded = decodeURIComponent(path);
    } catch {
      decoded = path;
    }
  }
  return CONTROL_ONLY_PATHS.has(cleanPath(decoded)) ? decoded : undefined;
}

/** Go's path.Clean for rooted paths: collapses `//`, `.` and `..`, drops a trailing slash. */
export function cleanPath(path: string): string {
  const out: string[] = [];
  for (const segment of path.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === "..") out.pop();
    else out.push(segment);
  }
  return `/${out.join("/")}`;
}
