import type { ApiRequestBody, ApiSchema, paths } from "@warren/proto/openapi";
import { DEFAULT_SANDBOX_TIMEOUT_SECONDS, V1_CREATE_DEFAULT_TIMEOUT_SECONDS } from "@warren/proto/sandbox-lifetime";
import { EgressPolicyError, validateEgressPolicy } from "../runtime/egress/policy.js";
import type { ListCursor } from "../store/sandboxes.js";
import { decodeCursor } from "../store/sandboxes.js";
import { badRequest } from "./errors.js";
import { inDateRange } from "./input-guard.js";
import { type BodyProblem, type BodyWords, parseRequestBody } from "./openapi-requests.js";
import { parseVolumeMounts, type RequestedMount } from "./volume-mounts.js";

/**
 * Request bodies and queries parsed once at the edge into typed values; every refusal is a 400. A body's shape is
 * checked against its schema in the OpenAPI document (`parseRequestBody`); what stays here is what a schema cannot
 * say (rules across fields, egress entries, volume paths) and E2B's own wording where the SDKs show it.
 */

type Json = Record<string, unknown>;
/** E2B's `NewSandboxV2`/`NewSandbox` body as the document types it. */
type NewSandboxWire = ApiRequestBody<"/v2/sandboxes", "post">;
type NetworkWire = ApiSchema<"SandboxNetworkConfig">;
type ListQueryWire = NonNullable<paths["/v2/sandboxes"]["get"]["parameters"]["query"]>;
type LogsQueryWire = NonNullable<paths["/v2/sandboxes/{sandboxID}/logs"]["get"]["parameters"]["query"]>;
export type SandboxState = ApiSchema<"ListedSandbox">["state"];

/** E2B network fields Warren does not implement: refused in words that say so rather than silently ignored. */
const UNSUPPORTED_NETWORK: Readonly<Record<string, string>> = {
  rules: "network.rules (HTTP header transforms on egress) is not supported by this server",
  egressProxy: "network.egressProxy (SOCKS5 egress) is not supported by this server",
  httpsPorts: "network.httpsPorts is not supported by this server",
};

/** The words for a problem with a network field Warren refuses; `prefix` is where the network config sits. */
function unsupportedNetwork(problem: BodyProblem, prefix: "" | "network."): string | undefined {
  if (!problem.field.startsWith(prefix)) return undefined;
  return UNSUPPORTED_NETWORK[problem.field.slice(prefix.length)];
}

/** The egress entries (IPs, CIDRs, domains) and E2B's rule that domains need `denyOut` to hold all traffic. */
function egressLists(network: Pick<NetworkWire, "allowOut" | "denyOut">): { allowOut: string[]; denyOut: string[] } {
  const allowOut = [...(network.allowOut ?? [])];
  const denyOut = [...(network.denyOut ?? [])];
  try {
    validateEgressPolicy({ allowOut, denyOut }, "network");
  } catch (error) {
    if (error instanceof EgressPolicyError) throw badRequest(error.message);
    throw error;
  }
  return { allowOut, denyOut };
}

/** E2B's SandboxNetworkUpdateConfig (`PUT /sandboxes/{id}/network`): a full replacement, omitted = cleared. */
export function parseNetworkUpdate(raw: unknown): {
  network: { allowOut: string[]; denyOut: string[] };
  allowInternetAccess: boolean | undefined;
} {
  const update = parseRequestBody("/sandboxes/{sandboxID}/network", "put", raw, (p) => unsupportedNetwork(p, ""));
  return { network: egressLists(update), allowInternetAccess: update.allow_internet_access };
}

/** The create body with E2B's defaults applied (`NewSandboxV2`'s fields under the api's names). */
export interface CreateSandboxBody {
  readonly templateId: NewSandboxWire["templateID"];
  readonly timeoutSeconds: number;
  readonly metadata: NonNullable<NewSandboxWire["metadata"]>;
  readonly envVars: NonNullable<NewSandboxWire["envVars"]>;
  readonly autoPause: boolean;
  readonly autoPauseMemory: boolean;
  readonly autoResume: boolean;
  /** E2B's SandboxNetworkConfig as sent (checked), with any fields the document does not name kept for the node. */
  readonly network: Json | null;
  readonly allowInternetAccess: NewSandboxWire["allow_internet_access"];
  /** E2B's `mcp` server names (the keys); null when the create did not ask for MCP. */
  readonly mcpServers: string[] | null;
  /** E2B `volumeMounts`, checked (names resolved per team when the create runs). */
  readonly volumeMounts: RequestedMount[];
}

/**
 * Whether a pause or snapshot keeps memory: E2B's wire field `memory` (false: files only), or `mode`
 * (`'full' | 'filesystem'`, the name SDKs from 2.55 use). Both given must agree; neither: undefined (full).
 */
export function parseMemoryMode(body: {
  readonly memory?: boolean;
  readonly mode?: "full" | "filesystem";
}): boolean | undefined {
  const { memory, mode } = body;
  if (mode === undefined) return memory;
  const fromMode = mode === "full";
  if (memory !== undefined && memory !== fromMode) {
    throw badRequest(`memory=${memory} contradicts mode '${mode}'; give one of them`);
  }
  return fromMode;
}

/** E2B's message for a lifetime that is not positive (the SDKs show it as it is). */
const createWords: BodyWords = (problem) =>
  problem.field === "timeout" && problem.keyword === "minimum"
    ? "Timeout must be greater than 0"
    : unsupportedNetwork(problem, "network.");

/** `POST /v2/sandboxes` (default timeout 300 s) and `POST /sandboxes` (v1: default 15 s), E2B's defaults. */
export function parseCreateBody(raw: unknown, version: 1 | 2): CreateSandboxBody {
  const body =
    version === 2
      ? parseRequestBody("/v2/sandboxes", "post", raw, createWords)
      : parseRequestBody("/sandboxes", "post", raw, createWords);
  const autoPause = body.autoPause ?? false;
  const autoResume = body.autoResume?.enabled ?? false;
  if (body.autoPauseMemory === false && !autoPause) {
    throw badRequest("autoPauseMemory=false only applies when autoPause is true.");
  }
  if (body.autoPauseMemory === false && autoResume) {
    throw badRequest(
      "autoPauseMemory=false (filesystem-only auto-pause) cannot be combined with autoResume; resume such a sandbox with connect.",
    );
  }
  if (autoResume && !autoPause) throw badRequest("autoResume requires autoPause to be true.");
  if (body.network) egressLists(body.network);
  return {
    templateId: body.templateID,
    timeoutSeconds:
      body.timeout ?? (version === 2 ? DEFAULT_SANDBOX_TIMEOUT_SECONDS : V1_CREATE_DEFAULT_TIMEOUT_SECONDS),
    metadata: body.metadata ?? {},
    envVars: body.envVars ?? {},
    autoPause,
    autoPauseMemory: body.autoPauseMemory ?? true,
    autoResume,
    network: (body.network as Json | undefined) ?? null,
    allowInternetAccess: body.allow_internet_access,
    mcpServers: body.mcp ? Object.keys(body.mcp) : null,
    volumeMounts: parseVolumeMounts(body.volumeMounts ?? []),
  };
}

export interface ConnectBody {
  readonly timeoutSeconds: number;
  readonly memory: boolean | undefined;
}

/** v2 connect: timeout optional (300 s); v1 connect: timeout required. 0 is the default. */
export function parseConnectBody(raw: unknown, version: 1 | 2): ConnectBody {
  const body =
    version === 2
      ? parseRequestBody("/v2/sandboxes/{sandboxID}/connect", "post", raw)
      : parseRequestBody("/sandboxes/{sandboxID}/connect", "post", raw);
  return { timeoutSeconds: body.timeout || DEFAULT_SANDBOX_TIMEOUT_SECONDS, memory: body.memory };
}

export function parseTimeoutBody(raw: unknown): number {
  return parseRequestBody("/sandboxes/{sandboxID}/timeout", "post", raw).timeout;
}

export interface ListParams {
  readonly states: SandboxState[];
  readonly metadata: Record<string, string>;
  readonly startedAfter?: Date;
  readonly template?: ListQueryWire["template"];
  readonly order: NonNullable<ListQueryWire["order"]>;
  readonly limit: number;
  readonly cursor?: ListCursor;
}

function single(value: unknown, name: string): string | undefined {
  if (value === undefined) return undefined;
  if (Array.isArray(value)) {
    if (name === "state") return value.join(",");
    throw badRequest(`${name} may be given once`);
  }
  if (typeof value !== "string") throw badRequest(`${name} is malformed`);
  return value;
}

function queryUnescape(value: string, what: string): string {
  try {
    return decodeURIComponent(value.replace(/\+/g, " "));
  } catch {
    throw badRequest(`metadata filter has a malformed ${what}`);
  }
}

/**
 * The SDK encodes the metadata filter three times; express decoded it once. Decode the joined string once
 * more, split on & and =, and decode each key and value a third time (infra `utils.parseFilters`).
 */
export function parseMetadataFilter(value: string): Record<string, string> {
  const filter: Record<string, string> = {};
  const joined = queryUnescape(value, "query");
  for (const pair of joined.split("&")) {
    if (pair === "") continue;
    const eq = pair.indexOf("=");
    if (eq <= 0) throw badRequest(`metadata filter entry '${pair}' is not key=value`);
    const key = queryUnescape(pair.slice(0, eq), "key");
    const entry = queryUnescape(pair.slice(eq + 1), "value");
    if (`${key}${entry}`.includes("\0")) throw badRequest("metadata filter contains a NUL character");
    filter[key] = entry;
  }
  return filter;
}

/** Query of `GET /v2/sandboxes` (and v1 `GET /sandboxes`, which lists running sandboxes only). */
export function parseListQuery(query: Record<string, unknown>, version: 1 | 2): ListParams {
  const stateRaw = version === 2 ? single(query.state, "state") : undefined;
  const states = (
    stateRaw ? stateRaw.split(",").filter(Boolean) : version === 2 ? ["running", "paused"] : ["running"]
  ).map((s) => s.trim());
  for (const state of states) {
    if (state !== "running" && state !== "paused") throw badRequest(`state '${state}' is not running or paused`);
  }
  const metadataRaw = single(query.metadata, "metadata");
  const startedAfterRaw = version === 2 ? single(query.startedAfter, "startedAfter") : undefined;
  let startedAfter: Date | undefined;
  if (startedAfterRaw !== undefined) {
    startedAfter = new Date(startedAfterRaw);
    if (!inDateRange(startedAfter)) throw badRequest(`startedAfter '${startedAfterRaw}' is not a date in years 1-9999`);
  }
  const order = single(query.order, "order") ?? "desc";
  if (order !== "asc" && order !== "desc") throw badRequest(`order must be asc or desc, got '${order}'`);
  const limitRaw = single(query.limit, "limit");
  const limit = limitRaw === undefined ? 100 : Number(limitRaw);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
    throw badRequest(`limit must be an integer from 1 to 100, got '${limitRaw}'`);
  }
  const tokenRaw = single(query.nextToken, "nextToken");
  let cursor: ListCursor | undefined;
  if (tokenRaw) {
    cursor = decodeCursor(tokenRaw);
    if (!cursor) throw badRequest("nextToken is invalid");
  }
  const template = single(query.template, "template");
  return {
    states: states as SandboxState[],
    metadata: metadataRaw ? parseMetadataFilter(metadataRaw) : {},
    order,
    limit: version === 2 ? limit : 100,
    ...(startedAfter ? { startedAfter } : {}),
    ...(template ? { template } : {}),
    ...(cursor ? { cursor } : {}),
  };
}

export interface LogsQuery {
  readonly limit: number;
  /** Unix milliseconds: entries from (forward) or up to (backward) this time. */
  readonly cursorMs: number | undefined;
  readonly direction: NonNullable<LogsQueryWire["direction"]>;
  readonly level: LogsQueryWire["level"];
  readonly search: string | undefined;
}

/** v1 `GET /sandboxes/{id}/logs?limit&start`; v2 `GET /v2/sandboxes/{id}/logs?cursor&limit&direction&level&search`. */
export function parseLogsQuery(query: Record<string, unknown>, version: 1 | 2): LogsQuery {
  const limitRaw = single(query.limit, "limit");
  const limit = limitRaw === undefined ? 1000 : Number(limitRaw);
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw badRequest("limit must be 1-1000");
  const cursorRaw = single(version === 1 ? query.start : query.cursor, version === 1 ? "start" : "cursor");
  const cursorMs = cursorRaw === undefined ? undefined : Number(cursorRaw);
  if (cursorMs !== undefined && (!Number.isInteger(cursorMs) || cursorMs < 0)) {
    throw badRequest(`${version === 1 ? "start" : "cursor"} must be a Unix time in milliseconds`);
  }
  const direction = single(query.direction, "direction") ?? "forward";
  if (direction !== "forward" && direction !== "backward") {
    throw badRequest("direction must be 'forward' or 'backward'");
  }
  const level = single(query.level, "level");
  if (level !== undefined && !["debug", "info", "warn", "error"].includes(level)) {
    throw badRequest("level must be one of debug, info, warn, error");
  }
  return {
    limit,
    cursorMs,
    direction,
    level: level as LogsQuery["level"],
    search: single(query.search, "search") || undefined,
  };
}
