import { ApiClient, requireString } from "./api.js";
import type { ConnectionConfig } from "./config.js";
import type { EnvdEndpoint } from "./envd.js";
import { apiError, InvalidArgumentError } from "./errors.js";

/** Request header on envd's process.Start: a one-time grant (from `createSecretGrant`) that the proxy redeems. */
export const SECRET_GRANT_HEADER = "Warren-Secret-Grant";
/** Request header on envd's process.Start: the process's lease in ms. */
export const LEASE_HEADER = "Warren-Lease-Ttl-Ms";

/**
 * Which secrets a command gets: secret names (each as the env var of its name upper-cased, `-` and `.` as `_`:
 * `openai-api-key` → `OPENAI_API_KEY`), or env var name → secret name.
 */
export type CommandSecrets = readonly string[] | Readonly<Record<string, string>>;

/** A lease: the process is reaped (SIGTERM, then SIGKILL) when `ttlMs` pass without a renewal. */
export interface LeaseOpts {
  ttlMs: number;
}

/** A lease as envd reports it; `remainingMs` does not count time the sandbox was paused. */
export interface LeaseInfo {
  pid: number;
  tag?: string;
  ttlMs: number;
  remainingMs: number;
  /** An estimate (now + remainingMs); a pause moves it later. */
  expiresAt: Date;
  renewals: number;
  /** Expired: SIGTERM sent, SIGKILL follows after the grace. */
  reaping: boolean;
}

/** `POST /warren/v1/sandboxes/{id}/secret-grants`: a one-time grant for one command of this sandbox. */
export async function createSecretGrant(
  config: ConnectionConfig,
  sandboxId: string,
  secrets: CommandSecrets,
  signal?: AbortSignal,
): Promise<string> {
  const body = Array.isArray(secrets) ? { secrets } : { env: secrets };
  if ((Array.isArray(secrets) ? secrets.length : Object.keys(secrets).length) === 0) {
    throw new InvalidArgumentError("secrets must name at least one secret");
  }
  const res = await new ApiClient(config).request<Record<string, unknown>>({
    method: "POST",
    path: `/warren/v1/sandboxes/${encodeURIComponent(sandboxId)}/secret-grants`,
    body,
    ...(signal ? { signal } : {}),
  });
  return requireString(res.body.grant, "grant");
}

function leaseFrom(raw: Record<string, unknown>): LeaseInfo {
  return {
    pid: Number(raw.pid),
    ...(typeof raw.tag === "string" ? { tag: raw.tag } : {}),
    ttlMs: Number(raw.ttlMs),
    remainingMs: Number(raw.remainingMs),
    expiresAt: new Date(String(raw.expiresAt)),
    renewals: Number(raw.renewals),
    reaping: raw.reaping === true,
  };
}

async function envdJson(endpoint: EnvdEndpoint, path: string, init: RequestInit): Promise<Record<string, unknown>> {
  const res = await fetch(`${endpoint.url}${path}`, {
    ...init,
    headers: { ...endpoint.headers, "Content-Type": "application/json" },
  });
  const text = await res.text();
  if (!res.ok) throw apiError(res.status, text);
  return JSON.parse(text) as Record<string, unknown>;
}

/** envd's `GET /warren/leases`. */
export async function listLeases(endpoint: EnvdEndpoint, signal?: AbortSignal): Promise<LeaseInfo[]> {
  const body = await envdJson(endpoint, "/warren/leases", { method: "GET", ...(signal ? { signal } : {}) });
  return ((body.leases as Record<string, unknown>[]) ?? []).map(leaseFrom);
}

/** envd's `POST /warren/leases/{pid}`: extends the lease by `ttlMs` (default: its own) from now. */
export async function renewLease(
  endpoint: EnvdEndpoint,
  pid: number,
  ttlMs: number | undefined,
  signal?: AbortSignal,
): Promise<LeaseInfo> {
  const body = await envdJson(endpoint, `/warren/leases/${pid}`, {
    method: "POST",
    body: JSON.stringify(ttlMs === undefined ? {} : { ttlMs }),
    ...(signal ? { signal } : {}),
  });
  return leaseFrom(body);
}
