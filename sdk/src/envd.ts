import { type Client, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { Process } from "@warren/proto/process/process_pb";
import { type ConnectionConfig, ENVD_PORT, SDK_VERSION } from "./config.js";

/** How to reach one sandbox's envd: its base URL, the headers every request carries, its token. */
export interface EnvdEndpoint {
  readonly sandboxId: string;
  readonly url: string;
  readonly accessToken: string | undefined;
  readonly config: ConnectionConfig;
  /** Headers every envd request carries: sandbox routing, access token, user agent. */
  readonly headers: Record<string, string>;
}

export function envdEndpoint(
  config: ConnectionConfig,
  sandboxId: string,
  sandboxDomain: string | undefined,
  accessToken: string | undefined,
): EnvdEndpoint {
  const headers: Record<string, string> = {
    ...config.routingHeaders(sandboxId, ENVD_PORT),
    "User-Agent": `warren-js-sdk/${SDK_VERSION}`,
  };
  if (accessToken) headers["X-Access-Token"] = accessToken;
  return {
    sandboxId,
    url: config.sandboxPortUrl(sandboxId, ENVD_PORT, sandboxDomain),
    accessToken,
    config,
    headers,
  };
}

/** The envd Connect clients, generated from proto/ (process.Process, filesystem.Filesystem). */
export interface EnvdRpc {
  readonly process: Client<typeof Process>;
  readonly filesystem: Client<typeof Filesystem>;
}

export function envdRpc(endpoint: EnvdEndpoint): EnvdRpc {
  const addHeaders: Interceptor = (next) => (req) => {
    for (const [name, value] of Object.entries(endpoint.headers)) {
      if (!req.header.has(name)) req.header.set(name, value);
    }
    return next(req);
  };
  const transport: Transport = createConnectTransport({
    baseUrl: endpoint.url,
    httpVersion: "1.1",
    useBinaryFormat: true,
    interceptors: [addHeaders],
  });
  return { process: createClient(Process, transport), filesystem: createClient(Filesystem, transport) };
}

/** `Authorization: Basic base64("<user>:")`: how envd RPCs choose the acting user. */
export function userHeaders(user: string | undefined): Record<string, string> {
  return user === undefined ? {} : { Authorization: `Basic ${Buffer.from(`${user}:`).toString("base64")}` };
}

/** Warren extra: the header carrying an approved exec review for the one request it was given for. */
export const APPROVAL_HEADER = "Warren-Approval";

export function approvalHeaders(approval: string | undefined): Record<string, string> {
  return approval === undefined ? {} : { [APPROVAL_HEADER]: approval };
}

/**
 * Is the sandbox still there? `false` only when the proxy/envd says it is gone (502), `undefined`
 * when envd cannot be reached at all (the network may be what is down).
 */
export async function checkHealth(endpoint: EnvdEndpoint, timeoutMs = 5_000): Promise<boolean | undefined> {
  try {
    const res = await fetch(`${endpoint.url}/health`, {
      headers: endpoint.headers,
      signal: AbortSignal.timeout(timeoutMs),
    });
    await res.arrayBuffer();
    if (res.status === 502) return false;
    return res.ok ? true : undefined;
  } catch {
    return undefined;
  }
}
