import type { ApiRequestBody, ApiSchema, paths } from "@warren/proto/openapi";
import { DEFAULT_SANDBOX_TIMEOUT_SECONDS, V1_CREATE_DEFAULT_TIMEOUT_SECONDS } from "@warren/proto/sandbox-lifetime";
import { EgressPolicyError, validateEgressPolicy } from "../runtime/egress/policy.js";
import type { ListCursor } from "../store/sandboxes.js";
import { decodeCursor } from "../store/sandboxes.js";
import { badRequest } from "./errors.js";
import { inDateRange } from "./input-guard.js";
import { parseVolumeMounts, type RequestedMount } from "./volume-mounts.js";

/**
 * Request bodies and queries parsed once at the edge into typed values; every refusal is a 400. The wire types come
 * from the OpenAPI document; the checks stay written out here where the answers' messages are part of the contract
 * (tests assert them) or the rule is beyond a schema (POSIX names, NUL characters, dates, cursors).
 */

type Json = Record<string, unknown>;
/** E2B's `NewSandboxV2`/`NewSandbox` body as the document types it. */
type NewSandboxWire = ApiRequestBody<"/v2/sandboxes", "post">;
type NetworkUpdateWire = ApiRequestBody<"/sandboxes/{sandboxID}/network", "put">;
type ListQueryWire = NonNullable<paths["/v2/sandboxes"]["get"]["parameters"]["query"]>;
type LogsQueryWire = NonNullable<paths["/v2/sandboxes/{sandboxID}/logs"]["get"]["parameters"]["query"]>;
export type SandboxState = ApiSchema<"ListedSandbox">["state"];

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function body(value: unknown): Json {
  if (value === undefined || value === null) return {};
  if (!isObject(value)) throw badRequest("request body must be a JSON object");
  return value;
}

function optionalBool(obj: Json, field: string): boolean | undefined {
  const value = obj[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "boolean") throw badRequest(`${field} must be a boolean, got ${JSON.stringify(value)}`);
  return value;
}

function optionalInt(obj: Json, field: string): number | undefined {
  const value = obj[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "number" || !Number.isInteger(value) || Math.abs(value) > 2 ** 31 - 1) {
    throw badRequest(`${field} must be a 32-bit integer, got ${JSON.stringify(value)}`);
  }
  return value;
}

/** POSIX environment variable names (what `/init` and every shell accept). */
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

function envVarMap(obj: Json, field: string): Record<string, string> {
  const map = stringMap(obj, field);
  for (const name of Object.keys(map)) {
    if (!ENV_NAME.test(name)) {
      throw badRequest(
        `${field}: '${name}' is not a valid variable name (letters, digits and '_', not starting with a digit)`,
      );
    }
  }
  return map;
}

function stringMap(obj: Json, field: string): Record<string, string> {
  const value = obj[field];
  if (value === undefined || value === null) return {};
  if (!isObject(value)) throw badRequest(`${field} must be an object of strings`);
  for (const [key, v] of Object.entries(value)) {
    if (typeof v !== "string") throw badRequest(`${field}.${key} must be a string, got ${JSON.stringify(v)}`);
  }
  return value as Record<string, string>;
}

function stringList(obj: Json, field: string): string[] | undefined {
  const value = obj[field];
  if (value === undefined || value === null) return undefined;
  if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) {
    throw badRequest(`${field} must be an array of strings`);
  }
  return value as string[];
}

/** Fields of E2B's network config that Warren does not implement: refused rather than silently ignored. */
function refuseUnsupportedNetwork(value: Json, field: string): void {
  if (isObject(value.rules) && Object.keys(value.rules).length > 0) {
    throw badRequest(`${field}.rules (HTTP header transforms on egress) is not supported by this server`);
  }
  if (value.egressProxy !== undefined && value.egressProxy !== null) {
    throw badRequest(`${field}.egressProxy (SOCKS5 egress) is not supported by this server`);
  }
}

function egressLists(value: Json, field: string): { allowOut: string[]; denyOut: string[] } {
  const allowOut = stringList(value, "allowOut") ?? [];
  const denyOut = stringList(value, "denyOut") ?? [];
  try {
    validateEgressPolicy({ allowOut, denyOut }, field);
  } catch (error) {
    if (error instanceof EgressPolicyError) throw badRequest(error.message);
    throw error;
  }
  return { allowOut, denyOut };
}

/** E2B's SandboxNetworkConfig at create, with the rules the server (not the SDK) enforces. */
export function parseNetwork(value: unknown): Json | null {
  if (value === undefined || value === null) return null;
  if (!isObject(value)) throw badRequest("network must be an object");
  egressLists(value, "network");
  refuseUnsupportedNetwork(value, "network");
  optionalBool(value, "allowPublicTraffic");
  if (value.maskRequestHost !== undefined && typeof value.maskRequestHost !== "string") {
    throw badRequest("network.maskRequestHost must be a string");
  }
  if (value.httpsPorts !== undefined && value.httpsPorts !== null) {
    throw badRequest("network.httpsPorts is not supported by this server");
  }
  return value;
}

/** E2B's SandboxNetworkUpdateConfig (`PUT /sandboxes/{id}/network`): a full replacement, omitted = cleared. */
export function parseNetworkUpdate(raw: unknown): {
  network: Required<Pick<NetworkUpdateWire, "allowOut" | "denyOut">>;
  allowInternetAccess: NetworkUpdateWire["allow_internet_access"];
} {
  const obj = body(raw);
  refuseUnsupportedNetwork(obj, "network");
  return { network: egressLists(obj, "network"), allowInternetAccess: optionalBool(obj, "allow_internet_access") };
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

/** MCP server names: E2B's catalogue keys (`exa`, `github/owner/repo`); bounded so a row stays small. */
const MCP_SERVER_NAME = /^[A-Za-z0-9][A-Za-z0-9._@/-]{0,127}$/;
const MCP_MAX_SERVERS = 64;

/**
 * E2B's `mcp` (`{ <server>: <its config> }`). As in E2B the api keeps only the server names: the SDK itself
 * starts `mcp-gateway` in the sandbox with the whole config, and that config carries the servers' credentials.
 */
export function parseMcp(value: unknown): string[] | null {
  if (value === undefined || value === null) return null;
  if (!isObject(value)) throw badRequest(`mcp must be an object of server configs, got ${JSON.stringify(value)}`);
  const names = Object.keys(value);
  if (names.length > MCP_MAX_SERVERS) throw badRequest(`mcp names ${names.length} servers, at most ${MCP_MAX_SERVERS}`);
  for (const name of names) {
    if (!MCP_SERVER_NAME.test(name)) {
      throw badRequest(`mcp: '${name}' is not a server name (1-128 letters, digits, '.', '_', '@', '/', '-')`);
    }
    if (!isObject(value[name])) throw badRequest(`mcp.${name} must be an object (the server's config)`);
  }
  return names;
}

/**
 * Whether a pause or snapshot keeps memory: E2B's wire field `memory` (false: files only), or `mode`
 * (`'full' | 'filesystem'`, the name SDKs from 2.55 use). Both given must agree; neither: undefined (full).
 */
export function parseMemoryMode(obj: Json): boolean | undefined {
  const memory = optionalBool(obj, "memory");
  const mode = obj.mode;
  if (mode === undefined || mode === null) return memory;
  if (mode !== "full" && mode !== "filesystem") {
    throw badRequest(`mode must be 'full' or 'filesystem', got ${JSON.stringify(mode)}`);
  }
  const fromMode = mode === "full";
  if (memory !== undefined && memory !== fromMode) {
    throw badRequest(`memory=${memory} contradicts mode '${mode}'; give one of them`);
  }
  return fromMode;
}

const TEMPLATE_REF = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}(:[A-Za-z0-9._-]{1,64})?$/;

/** `POST /v2/sandboxes` (default timeout 300 s) and `POST /sandboxes` (v1: default 15 s), E2B's defaults. */
export function parseCreateBody(raw: unknown, version: 1 | 2): CreateSandboxBody {
  const obj = body(raw);
  const templateId = obj.templateID;
  if (typeof templateId !== "string" || templateId === "") throw badRequest("templateID is required");
  if (!TEMPLATE_REF.test(templateId)) throw badRequest(`templateID '${templateId}' is not a valid template reference`);
  const timeout = optionalInt(obj, "timeout");
  if (timeout !== undefined && timeout <= 0) throw badRequest("Timeout must be greater than 0");
  const autoPause = optionalBool(obj, "autoPause") ?? false;
  const autoPauseMemory = optionalBool(obj, "autoPauseMemory");
  let autoResume = false;
  if (obj.autoResume !== undefined && obj.autoResume !== null) {
    if (!isObject(obj.autoResume)) throw badRequest("autoResume must be an object {enabled: boolean}");
    autoResume = optionalBool(obj.autoResume, "enabled") ?? false;
  }
  if (autoPauseMemory === false && !autoPause) {
    throw badRequest("autoPauseMemory=false only applies when autoPause is true.");
  }
  if (autoPauseMemory === false && autoResume) {
    throw badRequest(
      "autoPauseMemory=false (filesystem-only auto-pause) cannot be combined with autoResume; resume such a sandbox with connect.",
    );
  }
  if (autoResume && !autoPause) throw badRequest("autoResume requires autoPause to be true.");
  return {
    templateId,
    timeoutSeconds: timeout ?? (version === 2 ? DEFAULT_SANDBOX_TIMEOUT_SECONDS : V1_CREATE_DEFAULT_TIMEOUT_SECONDS),
    metadata: stringMap(obj, "metadata"),
    envVars: envVarMap(obj, "envVars"),
    autoPause,
    autoPauseMemory: autoPauseMemory ?? true,
    autoResume,
    network: parseNetwork(obj.network),
    allowInternetAccess: optionalBool(obj, "allow_internet_access"),
    mcpServers: parseMcp(obj.mcp),
    volumeMounts: parseVolumeMounts(obj.volumeMounts),
  };
}

export interface ConnectBody {
  readonly timeoutSeconds: number;
  readonly memory: boolean | undefined;
}

/** v2 connect: timeout optional (300 s); v1 connect: timeout required. */
export function parseConnectBody(raw: unknown, version: 1 | 2): ConnectBody {
  const obj = body(raw);
  const timeout = optionalInt(obj, "timeout");
  if (timeout === undefined && version === 1) throw badRequest("timeout is required");
  if (timeout !== undefined && timeout < 0) throw badRequest("Timeout must not be negative");
  return { timeoutSeconds: timeout || DEFAULT_SANDBOX_TIMEOUT_SECONDS, memory: optionalBool(obj, "memory") };
}

export function parseTimeoutBody(raw: unknown): number {
  const timeout = optionalInt(body(raw), "timeout");
  if (timeout === undefined) throw badRequest("timeout is required");
  if (timeout < 0) throw badRequest("Timeout must not be negative");
  return timeout;
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
