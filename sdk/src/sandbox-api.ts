import type { ApiRequestBody, ApiSchema } from "@warren/proto/openapi";
import { ApiClient, bodyCode, bodyMessage, newIdempotencyKey, requireString } from "./api.js";
import type { ConnectionOpts } from "./config.js";
import { InvalidArgumentError, SandboxError, SandboxNotFoundError } from "./errors.js";

/*
 * The wire types (bodies sent and answers read) are the api's OpenAPI document's (@warren/proto/openapi), imported
 * as types only: they add nothing to the bundle. Answers are still read defensively (`Partial`): the server may be
 * another E2B-compatible one, or an older Warren.
 */
type NewSandboxWire = ApiRequestBody<"/v2/sandboxes", "post">;
type ConnectWire = ApiRequestBody<"/v2/sandboxes/{sandboxID}/connect", "post">;
type SandboxWire = ApiSchema<"Sandbox">;
type SandboxDetailWire = ApiSchema<"SandboxDetail">;
type SandboxMetricWire = ApiSchema<"SandboxMetric">;
type Writable<T> = { -readonly [K in keyof T]: T[K] };

export type SandboxState = ApiSchema<"ListedSandbox">["state"];

/** What the API returns for a created or connected sandbox: enough to reach its data plane. */
export interface SandboxConnection {
  sandboxId: string;
  sandboxDomain?: string;
  envdVersion: string;
  envdAccessToken?: string;
  trafficAccessToken?: string;
}

export interface SandboxLifecycle {
  onTimeout: "kill" | "pause" | { action: "kill" | "pause"; keepMemory?: boolean };
  autoResume?: boolean;
}

/** E2B's SandboxNetworkConfig. */
export type SandboxNetworkOpts = ApiSchema<"SandboxNetworkConfig">;

export interface SandboxCreateOpts extends ConnectionOpts {
  template?: string;
  metadata?: Record<string, string>;
  envs?: Record<string, string>;
  /** Sandbox lifetime in ms (sent rounded up to seconds). Default: the server's (300 s). */
  timeoutMs?: number;
  allowInternetAccess?: boolean;
  network?: SandboxNetworkOpts;
  lifecycle?: SandboxLifecycle;
  /**
   * Warren extra: the `Idempotency-Key` of this create. One is generated when not given; it is the
   * same on every retry, so a create retried after a dropped response makes one sandbox, not two.
   */
  idempotencyKey?: string;
}

export interface SandboxConnectOpts extends ConnectionOpts {
  /** New lifetime in ms; for a running sandbox it only ever extends the current one. */
  timeoutMs?: number;
  onResume?: "restore" | "reboot";
}

export interface SandboxApiOpts
  extends Pick<
    ConnectionOpts,
    "apiKey" | "apiUrl" | "domain" | "apiHeaders" | "headers" | "debug" | "requestTimeoutMs" | "retries" | "signal"
  > {}

export interface SandboxInfo {
  sandboxId: string;
  templateId: string;
  name?: string;
  metadata: Record<string, string>;
  startedAt: Date;
  endAt: Date;
  state: SandboxState;
  cpuCount: number;
  memoryMB: number;
  envdVersion: string;
  allowInternetAccess?: boolean;
  network?: SandboxDetailWire["network"];
  lifecycle?: SandboxDetailWire["lifecycle"];
  sandboxDomain?: string;
}

export interface SandboxListOpts extends Omit<SandboxApiOpts, "signal"> {
  query?: { metadata?: Record<string, string>; state?: SandboxState[]; startedAfter?: Date; template?: string };
  order?: "asc" | "desc";
  limit?: number;
  nextToken?: string;
}

export interface SandboxMetrics {
  timestamp: Date;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

/** `POST /v2/sandboxes` body (NewSandboxV2), E2B's field names; undefined fields are left out. */
export function createBody(template: string, opts: SandboxCreateOpts): NewSandboxWire {
  const body: Writable<NewSandboxWire> = { templateID: template };
  if (opts.timeoutMs !== undefined) body.timeout = Math.ceil(opts.timeoutMs / 1000);
  if (opts.metadata !== undefined) body.metadata = opts.metadata;
  if (opts.envs !== undefined) body.envVars = opts.envs;
  if (opts.allowInternetAccess !== undefined) body.allow_internet_access = opts.allowInternetAccess;
  if (opts.network !== undefined) body.network = opts.network;
  if (opts.lifecycle !== undefined) {
    const onTimeout = opts.lifecycle.onTimeout;
    const action = typeof onTimeout === "string" ? onTimeout : onTimeout.action;
    const keepMemory = typeof onTimeout === "string" ? undefined : onTimeout.keepMemory;
    if (action !== "pause" && action !== "kill") {
      throw new InvalidArgumentError(`lifecycle.onTimeout must be 'pause' or 'kill', got '${String(action)}'`);
    }
    if (keepMemory !== undefined && action !== "pause") {
      throw new InvalidArgumentError("lifecycle keepMemory applies only when onTimeout is 'pause'");
    }
    if (opts.lifecycle.autoResume && (action !== "pause" || keepMemory === false)) {
      throw new InvalidArgumentError("lifecycle.autoResume needs onTimeout 'pause' with memory kept");
    }
    body.autoPause = action === "pause";
    if (keepMemory !== undefined) body.autoPauseMemory = keepMemory;
    if (opts.lifecycle.autoResume !== undefined) body.autoResume = { enabled: opts.lifecycle.autoResume };
  }
  return body;
}

export async function createSandbox(template: string, opts: SandboxCreateOpts): Promise<SandboxConnection> {
  const api = new ApiClient(opts);
  const res = await api.request<Partial<SandboxWire>>({
    method: "POST",
    path: "/v2/sandboxes",
    body: createBody(template, opts),
    idempotencyKey: opts.idempotencyKey ?? newIdempotencyKey(),
    requestTimeoutMs: opts.requestTimeoutMs,
    signal: opts.signal,
  });
  return connectionFrom(res.body);
}

export async function connectSandbox(sandboxId: string, opts: SandboxConnectOpts): Promise<SandboxConnection> {
  const body: Writable<NonNullable<ConnectWire>> = {};
  if (opts.timeoutMs !== undefined) body.timeout = Math.ceil(opts.timeoutMs / 1000);
  if (opts.onResume === "reboot") body.memory = false;
  else if (opts.onResume !== undefined && opts.onResume !== "restore") {
    throw new InvalidArgumentError(`onResume must be 'restore' or 'reboot', got '${String(opts.onResume)}'`);
  }
  const res = await new ApiClient(opts).request<Partial<SandboxWire>>({
    method: "POST",
    path: `/v2/sandboxes/${encodeURIComponent(sandboxId)}/connect`,
    body,
    expect: [404],
    signal: opts.signal,
  });
  if (res.status === 404 || bodyCode(res.body) === 404) {
    throw new SandboxNotFoundError(`Paused sandbox ${sandboxId} not found`, { statusCode: 404 });
  }
  return connectionFrom(res.body);
}

/** The connection fields of a `Sandbox` response (create, connect, and each fork). */
export function connectionFrom(body: Partial<SandboxWire>): SandboxConnection {
  const connection: SandboxConnection = {
    sandboxId: requireString(body.sandboxID, "sandboxID"),
    envdVersion: requireString(body.envdVersion, "envdVersion"),
  };
  if (typeof body.domain === "string" && body.domain !== "") connection.sandboxDomain = body.domain;
  if (typeof body.envdAccessToken === "string") connection.envdAccessToken = body.envdAccessToken;
  if (typeof body.trafficAccessToken === "string") connection.trafficAccessToken = body.trafficAccessToken;
  return connection;
}

export async function getSandboxInfo(sandboxId: string, opts: SandboxApiOpts = {}): Promise<SandboxInfo> {
  const res = await new ApiClient(opts).request<Partial<SandboxDetailWire>>({
    method: "GET",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}`,
    expect: [404],
    signal: opts.signal,
  });
  if (res.status === 404 || bodyCode(res.body) === 404) {
    throw new SandboxNotFoundError(`Sandbox ${sandboxId} not found`, { statusCode: 404 });
  }
  return sandboxInfoFrom(res.body);
}

export function sandboxInfoFrom(body: Partial<SandboxDetailWire>): SandboxInfo {
  const info: SandboxInfo = {
    sandboxId: String(body.sandboxID),
    templateId: String(body.templateID),
    metadata: { ...body.metadata },
    startedAt: new Date(String(body.startedAt)),
    endAt: new Date(String(body.endAt)),
    state: body.state as SandboxState,
    cpuCount: Number(body.cpuCount),
    memoryMB: Number(body.memoryMB),
    envdVersion: String(body.envdVersion),
  };
  if (typeof body.alias === "string") info.name = body.alias;
  if (typeof body.allowInternetAccess === "boolean") info.allowInternetAccess = body.allowInternetAccess;
  if (typeof body.network === "object" && body.network !== null) info.network = body.network;
  if (typeof body.lifecycle === "object" && body.lifecycle !== null) info.lifecycle = body.lifecycle;
  // Not in E2B's SandboxDetail, but some servers send the sandbox's domain with it.
  const domain = (body as { domain?: unknown }).domain;
  if (typeof domain === "string" && domain !== "") info.sandboxDomain = domain;
  return info;
}

export async function killSandbox(sandboxId: string, opts: SandboxApiOpts = {}): Promise<boolean> {
  const res = await new ApiClient(opts).request({
    method: "DELETE",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}`,
    expect: [404],
    signal: opts.signal,
  });
  return !(res.status === 404 || bodyCode(res.body) === 404);
}

export async function setSandboxTimeout(
  sandboxId: string,
  timeoutMs: number,
  opts: SandboxApiOpts = {},
): Promise<void> {
  const res = await new ApiClient(opts).request({
    method: "POST",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}/timeout`,
    body: { timeout: Math.ceil(timeoutMs / 1000) },
    expect: [404],
    signal: opts.signal,
  });
  if (res.status === 404 || bodyCode(res.body) === 404) {
    throw new SandboxNotFoundError(`Sandbox ${sandboxId} not found`, { statusCode: 404 });
  }
}

export async function pauseSandbox(
  sandboxId: string,
  opts: SandboxApiOpts & { keepMemory?: boolean } = {},
): Promise<boolean> {
  const res = await new ApiClient(opts).request({
    method: "POST",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}/pause`,
    body: opts.keepMemory === undefined ? {} : { memory: opts.keepMemory },
    expect: [404, 409],
    signal: opts.signal,
  });
  const code = bodyCode(res.body) ?? (res.status >= 400 ? res.status : undefined);
  if (code === 404) throw new SandboxNotFoundError(`Sandbox ${sandboxId} not found`, { statusCode: 404 });
  return code !== 409;
}

export async function getSandboxMetrics(
  sandboxId: string,
  opts: SandboxApiOpts & { start?: Date; end?: Date } = {},
): Promise<SandboxMetrics[]> {
  const res = await new ApiClient(opts).request<Array<Partial<SandboxMetricWire>>>({
    method: "GET",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}/metrics`,
    query: {
      start: opts.start ? String(Math.floor(opts.start.getTime() / 1000)) : undefined,
      end: opts.end ? String(Math.floor(opts.end.getTime() / 1000)) : undefined,
    },
    expect: [404],
    signal: opts.signal,
  });
  if (res.status === 404 || bodyCode(res.body) === 404) {
    throw new SandboxNotFoundError(`Sandbox ${sandboxId} not found`, { statusCode: 404 });
  }
  return (res.body ?? []).map((m) => ({
    timestamp: new Date(String(m.timestamp)),
    cpuUsedPct: Number(m.cpuUsedPct),
    cpuCount: Number(m.cpuCount),
    memUsed: Number(m.memUsed),
    memTotal: Number(m.memTotal),
    memCache: Number(m.memCache ?? 0),
    diskUsed: Number(m.diskUsed),
    diskTotal: Number(m.diskTotal),
  }));
}

/** Pages of `GET /v2/sandboxes` (E2B's SandboxPaginator): `while (p.hasNext) await p.nextItems()`. */
export class SandboxPaginator {
  private _hasNext = true;
  private _nextToken: string | undefined;

  constructor(private readonly opts: SandboxListOpts = {}) {
    this._nextToken = opts.nextToken;
  }

  get hasNext(): boolean {
    return this._hasNext;
  }

  get nextToken(): string | undefined {
    return this._nextToken;
  }

  async nextItems(opts: SandboxApiOpts = {}): Promise<SandboxInfo[]> {
    if (!this._hasNext) throw new SandboxError("No more items to fetch");
    const query = this.opts.query ?? {};
    const res = await new ApiClient({ ...this.opts, ...opts }).request<Array<Partial<SandboxDetailWire>>>({
      method: "GET",
      path: "/v2/sandboxes",
      query: {
        metadata: query.metadata ? encodeMetadataFilter(query.metadata) : undefined,
        state: query.state?.join(","),
        startedAfter: query.startedAfter?.toISOString(),
        template: query.template,
        order: this.opts.order,
        limit: this.opts.limit === undefined ? undefined : String(this.opts.limit),
        nextToken: this._nextToken,
      },
      signal: opts.signal,
    });
    const next = res.headers.get("x-next-token");
    this._nextToken = next || undefined;
    this._hasNext = Boolean(next);
    if (!Array.isArray(res.body)) throw new SandboxError(`list answered ${bodyMessage(res.body) || "a non-list"}`);
    return res.body.map(sandboxInfoFrom);
  }
}

/**
 * E2B's metadata filter: each key and value percent-encoded, joined as a query string (which
 * encodes again); the URL encodes the whole value once more. Servers decode it three times.
 */
export function encodeMetadataFilter(metadata: Record<string, string>): string {
  return new URLSearchParams(
    Object.entries(metadata).map(([k, v]): [string, string] => [encodeURIComponent(k), encodeURIComponent(v)]),
  ).toString();
}
