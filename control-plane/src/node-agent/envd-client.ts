import { request } from "node:http";
import {
  ENVD_ACCESS_TOKEN_HEADER,
  ENVD_INIT_PATH,
  ENVD_LEASE_EVENTS_PATH,
  ENVD_VERSION_HEADER,
  type EnvdInitBody,
  type EnvdLeaseEvent,
  type EnvdLeaseEvents,
} from "@warren/proto/envd-http";

/** What the node agent sets in a sandbox's envd: every field of envd's /init body (the contract) but the clock. */
export interface EnvdInit extends Required<Omit<EnvdInitBody, "timestamp">> {
  /** The token envd already holds (a sandbox started from a memory snapshot keeps its source's): sent to /init. */
  readonly currentAccessToken?: string;
}

/**
 * POST /init to a fresh sandbox's envd: env vars, access token, default user and workdir, and the node's clock
 * (envd accepts the timestamp; a namespace sandbox shares the host clock anyway). Resolves with envd's version.
 */
export function initEnvd(envdUrl: string, init: EnvdInit, timeoutMs = 5000): Promise<string> {
  const { currentAccessToken, ...fields } = init;
  const initBody: EnvdInitBody = { ...fields, timestamp: new Date().toISOString() };
  const body = JSON.stringify(initBody);
  const url = new URL(ENVD_INIT_PATH, envdUrl);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        method: "POST",
        agent: false,
        timeout: timeoutMs,
        headers: {
          "Content-Type": "application/json",
          "Content-Length": Buffer.byteLength(body),
          ...(currentAccessToken ? { [ENVD_ACCESS_TOKEN_HEADER]: currentAccessToken } : {}),
        },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8").on("data", (chunk: string) => {
          text += chunk;
        });
        res.on("end", () => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) resolve(String(res.headers[ENVD_VERSION_HEADER.toLowerCase()] ?? ""));
          else reject(new Error(`envd /init answered ${status}: ${text.slice(0, 200)}`));
        });
      },
    );
    req.once("timeout", () => req.destroy(new Error(`envd /init timed out after ${timeoutMs} ms`)));
    req.once("error", reject);
    req.end(body);
  });
}

/**
 * envd's process lease journal after `after` (at most 1000 entries). Best effort: an envd that does not answer
 * within a second, or predates leases, has none to report now.
 */
export async function fetchLeaseEvents(envdUrl: string, accessToken: string, after: number): Promise<EnvdLeaseEvent[]> {
  try {
    const url = `${envdUrl}${ENVD_LEASE_EVENTS_PATH}?after=${Math.max(0, Math.floor(after))}`;
    const res = await fetch(url, {
      headers: { [ENVD_ACCESS_TOKEN_HEADER]: accessToken },
      signal: AbortSignal.timeout(1000),
    });
    if (!res.ok) {
      await res.body?.cancel();
      return [];
    }
    const body = (await res.json()) as Partial<EnvdLeaseEvents>;
    return Array.isArray(body.events) ? body.events.slice(0, 1000) : [];
  } catch {
    return [];
  }
}
