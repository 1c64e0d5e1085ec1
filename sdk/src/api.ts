import { randomUUID } from "node:crypto";
import { ConnectionConfig, type ConnectionOpts, SDK_VERSION } from "./config.js";
import { AuthenticationError, apiError, InvalidArgumentError, SandboxError } from "./errors.js";

/** A control-plane response: status, headers and the parsed JSON body (undefined for 204/empty). */
export interface ApiResponse<T> {
  readonly status: number;
  readonly headers: Headers;
  readonly body: T;
}

export interface ApiRequest {
  method: "GET" | "POST" | "PUT" | "DELETE";
  path: string;
  query?: Record<string, string | undefined>;
  body?: unknown;
  /** Sent as `Idempotency-Key`; with it a request is safe to repeat after a 5xx or a dropped connection. */
  idempotencyKey?: string;
  /** Statuses the caller handles itself (returned, not thrown). */
  expect?: number[];
  headers?: Record<string, string>;
  signal?: AbortSignal;
  requestTimeoutMs?: number;
}

const RETRYABLE_STATUSES = new Set([502, 503, 504]);
const MAX_BACKOFF_MS = 5_000;

/**
 * The control-plane REST client: E2B's paths and headers (`X-API-KEY`), retries that never repeat
 * an unsafe request, and E2B's error mapping.
 */
export class ApiClient {
  readonly config: ConnectionConfig;

  constructor(opts: ConnectionOpts | ConnectionConfig = {}) {
    this.config = opts instanceof ConnectionConfig ? opts : new ConnectionConfig(opts);
  }

  headers(extra: Record<string, string> = {}): Record<string, string> {
    if (!this.config.apiKey) {
      throw new AuthenticationError(
        "API key is required, please visit your Warren dashboard or run `warren key create`, then set WARREN_API_KEY or pass apiKey.",
      );
    }
    return {
      "X-API-KEY": this.config.apiKey,
      "User-Agent": `warren-js-sdk/${SDK_VERSION}`,
      lang: "js",
      package_version: SDK_VERSION,
      publisher: "warren",
      sdk_runtime: "node",
      ...this.config.apiHeaders,
      ...extra,
    };
  }

  /**
   * Sends a request, retrying (a) a 429 that says when (`Retry-After` seconds), and (b) a 502/503/504
   * or dropped connection when the request is safe to repeat: a GET, or one carrying an
   * Idempotency-Key (the same key on every attempt, so the server runs it once).
   */
  async request<T>(req: ApiRequest): Promise<ApiResponse<T>> {
    const url = new URL(this.config.apiUrl + req.path);
    for (const [key, value] of Object.entries(req.query ?? {})) {
      if (value !== undefined) url.searchParams.set(key, value);
    }
    const headers = this.headers(req.headers);
    if (req.body !== undefined) headers["Content-Type"] = "application/json";
    if (req.idempotencyKey !== undefined) headers["Idempotency-Key"] = req.idempotencyKey;
    const repeatable = req.method === "GET" || req.idempotencyKey !== undefined;
    const startedAt = Date.now();
    const budgetMs = this.config.requestTimeoutMs > 0 ? this.config.requestTimeoutMs : 60_000;

    for (let attempt = 0; ; attempt++) {
      const retriesLeft = attempt < this.config.retries;
      let res: Response;
      try {
        res = await fetch(url, {
          method: req.method,
          headers,
          body: req.body === undefined ? undefined : JSON.stringify(req.body),
          signal: this.config.signal(req.requestTimeoutMs, req.signal),
        });
      } catch (error) {
        if (req.signal?.aborted) throw error;
        if (isTimeout(error)) {
          throw new SandboxError(`request to ${req.method} ${req.path} timed out`, { cause: error });
        }
        if (repeatable && retriesLeft) {
          await sleep(backoff(attempt), req.signal);
          continue;
        }
        throw new SandboxError(`request to ${req.method} ${req.path} failed: ${(error as Error).message}`, {
          cause: error,
        });
      }
      const text = await res.text();
      if (res.ok || req.expect?.includes(res.status)) {
        return { status: res.status, headers: res.headers, body: parseBody(text) as T };
      }
      if (retriesLeft) {
        const retryAfter = retryAfterMs(res.headers.get("retry-after"));
        if (res.status === 429 && retryAfter !== undefined && Date.now() - startedAt + retryAfter <= budgetMs) {
          await sleep(retryAfter, req.signal);
          continue;
        }
        if (RETRYABLE_STATUSES.has(res.status) && repeatable) {
          await sleep(retryAfter ?? backoff(attempt), req.signal);
          continue;
        }
      }
      throw apiError(res.status, text);
    }
  }
}

/** A fresh idempotency key (a random UUID). */
export function newIdempotencyKey(): string {
  return randomUUID();
}

function parseBody(text: string): unknown {
  if (text === "") return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function retryAfterMs(header: string | null): number | undefined {
  if (header === null || !/^\d+$/.test(header.trim())) return undefined;
  return Number(header.trim()) * 1000;
}

function backoff(attempt: number): number {
  return Math.min(100 * 2 ** attempt, MAX_BACKOFF_MS);
}

function isTimeout(error: unknown): boolean {
  return error instanceof Error && (error.name === "TimeoutError" || error.name === "AbortError");
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The numeric `code` inside an E2B error body (endpoint checks look at it, not at the HTTP status). */
export function bodyCode(body: unknown): number | undefined {
  if (typeof body === "object" && body !== null && "code" in body) {
    const code = (body as { code: unknown }).code;
    return typeof code === "number" ? code : undefined;
  }
  return undefined;
}

export function bodyMessage(body: unknown): string {
  if (typeof body === "object" && body !== null && "message" in body)
    return String((body as { message: unknown }).message);
  return typeof body === "string" ? body : "";
}

export function requireString(value: unknown, what: string): string {
  if (typeof value !== "string" || value === "") throw new InvalidArgumentError(`the API answered without ${what}`);
  return value;
}
