import { InvalidArgumentError } from "./errors.js";

export const SDK_VERSION = "0.1.0";

import { CODE_GATEWAY_PORT, ENVD_PORT } from "@warren/proto/ports";

export { CODE_GATEWAY_PORT, ENVD_PORT };
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/** How data-plane requests name their sandbox: by headers on one origin, or by a `<port>-<id>.<domain>` host. */
export type SandboxRouting = "header" | "host";

/** Connection options shared by every call. Environment variables fill what is not given. */
export interface ConnectionOpts {
  /** API key, sent as `X-API-KEY`. Default: `WARREN_API_KEY`, then `E2B_API_KEY`. */
  apiKey?: string;
  /** Base domain: the API is `https://api.<domain>`, sandboxes `https://<port>-<id>.<domain>`. Default: `WARREN_DOMAIN`, `E2B_DOMAIN`, `e2b.app`. */
  domain?: string;
  /** Control-plane base URL. Default: `WARREN_API_URL`, `E2B_API_URL`, else `https://api.<domain>`. */
  apiUrl?: string;
  /**
   * One origin for all data-plane traffic (envd, code gateway, ports) of every sandbox, e.g. a
   * self-hosted proxy at `http://proxy.internal:8080`. Requests name the sandbox with the
   * `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers: no wildcard DNS needed.
   * Default: `WARREN_SANDBOX_URL`, `E2B_SANDBOX_URL`.
   */
  sandboxUrl?: string;
  /** `header` (default when `sandboxUrl` is set) or `host` (`<port>-<id>.<domain>`, the default otherwise). */
  routing?: SandboxRouting;
  /** Use `http://` for host-routed data-plane URLs (a self-hosted proxy without TLS). Default false. */
  insecure?: boolean;
  /** Skip the API (`Sandbox.create/connect` answer locally) and talk to envd at `sandboxUrl` or localhost. */
  debug?: boolean;
  /** Timeout of each API call and unary envd call, in ms. 0 disables. Default 60 000. */
  requestTimeoutMs?: number;
  /** Retries of a control-plane call after 429/502/503/504 or a dropped connection (when safe to repeat). Default 3. */
  retries?: number;
  /** Extra headers for control-plane requests (never sent to envd). */
  apiHeaders?: Record<string, string>;
  /** Deprecated E2B alias of `apiHeaders`. */
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

function env(...names: string[]): string | undefined {
  for (const name of names) {
    const value = process.env[name];
    if (value !== undefined && value !== "") return value;
  }
  return undefined;
}

/** The resolved, validated connection settings of one client. */
export class ConnectionConfig {
  readonly apiKey: string | undefined;
  readonly domain: string;
  readonly apiUrl: string;
  readonly sandboxUrl: string | undefined;
  readonly routing: SandboxRouting;
  readonly insecure: boolean;
  readonly debug: boolean;
  readonly requestTimeoutMs: number;
  readonly retries: number;
  readonly apiHeaders: Record<string, string>;

  constructor(opts: ConnectionOpts = {}) {
    this.apiKey = opts.apiKey ?? env("WARREN_API_KEY", "E2B_API_KEY");
    this.domain = opts.domain ?? env("WARREN_DOMAIN", "E2B_DOMAIN") ?? "e2b.app";
    this.debug = opts.debug ?? (env("WARREN_DEBUG", "E2B_DEBUG") ?? "").toLowerCase() === "true";
    this.apiUrl = trimSlash(
      opts.apiUrl ??
        env("WARREN_API_URL", "E2B_API_URL") ??
        (this.debug ? "http://localhost:3000" : `https://api.${this.domain}`),
    );
    const sandboxUrl = opts.sandboxUrl ?? env("WARREN_SANDBOX_URL", "E2B_SANDBOX_URL");
    this.sandboxUrl = sandboxUrl === undefined ? undefined : trimSlash(sandboxUrl);
    this.routing = opts.routing ?? (this.sandboxUrl !== undefined || this.debug ? "header" : "host");
    if (this.routing === "header" && this.sandboxUrl === undefined && !this.debug) {
      throw new InvalidArgumentError("routing 'header' needs a sandboxUrl (the one origin that routes by headers)");
    }
    this.insecure = opts.insecure ?? false;
    this.requestTimeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.retries = opts.retries ?? 3;
    if (!Number.isInteger(this.retries) || this.retries < 0) {
      throw new InvalidArgumentError(`retries must be a non-negative integer, got ${opts.retries}`);
    }
    this.apiHeaders = { ...opts.headers, ...opts.apiHeaders };
  }

  /** Base URL for data-plane traffic to `port` of a sandbox. */
  sandboxPortUrl(sandboxId: string, port: number, sandboxDomain: string | undefined): string {
    if (this.routing === "header") return this.sandboxUrl ?? `http://localhost:${port}`;
    return `${this.insecure ? "http" : "https"}://${this.host(sandboxId, port, sandboxDomain)}`;
  }

  /** `<port>-<id>.<domain>`: the host of a sandbox port (E2B's getHost). */
  host(sandboxId: string, port: number, sandboxDomain: string | undefined): string {
    if (this.debug && this.sandboxUrl === undefined) return `localhost:${port}`;
    return `${port}-${sandboxId}.${sandboxDomain || this.domain}`;
  }

  /** Headers naming the sandbox and port; sent on every data-plane request (harmless under host routing). */
  routingHeaders(sandboxId: string, port: number): Record<string, string> {
    return { "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": String(port) };
  }

  /** An AbortSignal for one request: the request timeout combined with the caller's signal. */
  signal(requestTimeoutMs?: number, signal?: AbortSignal): AbortSignal | undefined {
    const timeout = requestTimeoutMs ?? this.requestTimeoutMs;
    const signals: AbortSignal[] = [];
    if (timeout > 0) signals.push(AbortSignal.timeout(timeout));
    if (signal) signals.push(signal);
    if (signals.length === 0) return undefined;
    return signals.length === 1 ? signals[0] : AbortSignal.any(signals);
  }
}

function trimSlash(url: string): string {
  return url.replace(/\/+$/, "");
}
