import { createReadStream } from "node:fs";
import { Readable } from "node:stream";
import { type ApiClient, type ApiRequest, type ApiResponse, bodyMessage, sleep } from "../api.js";
import { RateLimitError, SandboxError, TemplateError } from "../errors.js";
import { spoolArchive } from "./archive.js";
import { BuildError, FileUploadError } from "./errors.js";
import { LogEntry, type LogEntryLevel } from "./logs.js";
import type { BuildStatusReason, TemplateBuildStatus, TemplateBuildStatusResponse, TemplateSpec } from "./types.js";

/**
 * The REST calls of a template build (E2B-TEMPLATES.md §1.2, §2): create, upload links, the archive PUT,
 * trigger, status polling. Each maps API errors to the class E2B's SDK throws there; 401, 429 and 503 keep
 * the SDK's AuthenticationError, RateLimitError and ServiceBusyError.
 */

type ErrorClass = new (message: string) => Error;

/** Sends a request; a refusal other than 401/429/503 becomes `ErrorClass("<status>: <message>")`. */
export async function callApi<T>(client: ApiClient, req: ApiRequest, errorClass: ErrorClass): Promise<ApiResponse<T>> {
  try {
    return await client.request<T>(req);
  } catch (error) {
    throw asApiError(error, errorClass);
  }
}

export function asApiError(error: unknown, errorClass: ErrorClass): unknown {
  if (!(error instanceof SandboxError) || error instanceof RateLimitError || error.statusCode === undefined) {
    return error;
  }
  if (errorClass === TemplateError) return new TemplateError(error.message, { statusCode: error.statusCode });
  return new errorClass(error.message);
}

function record(body: unknown): Record<string, unknown> {
  return typeof body === "object" && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
}

export interface CreatedBuild {
  templateID: string;
  buildID: string;
  tags: string[];
}

/** `POST /v3/templates`: a new build (status `waiting`) of a new or existing template. */
export async function requestBuild(
  client: ApiClient,
  body: { name: string; tags?: string[]; cpuCount?: number; memoryMB?: number; minFreeDiskMb?: number },
  signal?: AbortSignal,
): Promise<CreatedBuild> {
  const res = await callApi<unknown>(client, { method: "POST", path: "/v3/templates", body, signal }, BuildError);
  const data = record(res.body);
  if (typeof data.templateID !== "string" || typeof data.buildID !== "string") {
    throw new BuildError("Failed to request build");
  }
  return {
    templateID: data.templateID,
    buildID: data.buildID,
    tags: Array.isArray(data.tags) ? data.tags.map(String) : [],
  };
}

export interface UploadLink {
  present: boolean;
  url?: string;
  headers?: Record<string, string>;
}

/** `GET /templates/{id}/files/{hash}`: whether the server has a COPY's files, and where to upload them. */
export async function getFileUploadLink(
  client: ApiClient,
  templateID: string,
  filesHash: string,
  signal?: AbortSignal,
): Promise<UploadLink> {
  const res = await callApi<unknown>(
    client,
    {
      method: "GET",
      path: `/templates/${encodeURIComponent(templateID)}/files/${encodeURIComponent(filesHash)}`,
      signal,
    },
    FileUploadError,
  );
  if (res.body === undefined) throw new FileUploadError("Failed to get file upload link");
  const data = record(res.body);
  const link: UploadLink = { present: data.present === true };
  if (typeof data.url === "string") link.url = data.url;
  if (typeof data.headers === "object" && data.headers !== null) {
    link.headers = Object.fromEntries(Object.entries(data.headers).map(([k, v]) => [k, String(v)]));
  }
  return link;
}

/** The default deadline of one archive upload; a caller's `requestTimeoutMs` replaces it. */
export const FILE_UPLOAD_TIMEOUT_MS = 3_600_000;

/**
 * Archives a COPY step's files and PUTs them to `url` (no API key: the URL or `headers` authorize it) with an
 * exact Content-Length. A relative `url` is resolved against the API's URL.
 */
export async function uploadFiles(opts: {
  url: string;
  apiUrl: string;
  headers?: Record<string, string>;
  src: string;
  contextPath: string;
  ignorePatterns: string[];
  resolveSymlinks: boolean;
  gzip: boolean;
  signal?: AbortSignal;
  requestTimeoutMs?: number;
  stackTrace?: string;
}): Promise<void> {
  let cleanup: (() => Promise<void>) | undefined;
  try {
    const archive = await spoolArchive(opts.src, opts.contextPath, opts.ignorePatterns, opts);
    cleanup = archive.cleanup;
    const timeout = opts.requestTimeoutMs ?? FILE_UPLOAD_TIMEOUT_MS;
    const signals = [...(timeout > 0 ? [AbortSignal.timeout(timeout)] : []), ...(opts.signal ? [opts.signal] : [])];
    const headers = Object.fromEntries(
      Object.entries(opts.headers ?? {}).filter(([name]) => name.toLowerCase() !== "content-length"),
    );
    const res = await fetch(new URL(opts.url, `${opts.apiUrl}/`), {
      method: "PUT",
      body: Readable.toWeb(createReadStream(archive.path)) as ReadableStream,
      headers: { ...headers, "Content-Length": String(archive.size) },
      duplex: "half",
      signal: signals.length === 0 ? undefined : AbortSignal.any(signals),
    } as RequestInit);
    await res.arrayBuffer().catch(() => undefined);
    if (!res.ok) throw new FileUploadError(`Failed to upload file: ${res.statusText}`, opts.stackTrace);
  } catch (error) {
    if (error instanceof FileUploadError) throw error;
    throw new FileUploadError(`Failed to upload file: ${error}`, opts.stackTrace);
  } finally {
    await cleanup?.();
  }
}

/** `POST /v2/templates/{id}/builds/{buildID}`: starts a waiting build with the template document. */
export async function triggerBuild(
  client: ApiClient,
  templateID: string,
  buildID: string,
  template: TemplateSpec,
  signal?: AbortSignal,
): Promise<void> {
  await callApi(
    client,
    {
      method: "POST",
      path: `/v2/templates/${encodeURIComponent(templateID)}/builds/${encodeURIComponent(buildID)}`,
      body: template,
      signal,
    },
    BuildError,
  );
}

const LEVELS = new Set<LogEntryLevel>(["debug", "info", "warn", "error"]);

function logEntryFrom(raw: unknown): LogEntry {
  const entry = record(raw);
  const level = LEVELS.has(entry.level as LogEntryLevel) ? (entry.level as LogEntryLevel) : "info";
  const log = new LogEntry(new Date(String(entry.timestamp)), level, String(entry.message ?? ""));
  if (typeof entry.step === "string") log.step = entry.step;
  return log;
}

function reasonFrom(raw: unknown): BuildStatusReason | undefined {
  if (typeof raw !== "object" || raw === null) return undefined;
  const reason = record(raw);
  const out: BuildStatusReason = {
    message: bodyMessage(reason),
    logEntries: Array.isArray(reason.logEntries) ? reason.logEntries.map(logEntryFrom) : [],
  };
  if (typeof reason.step === "string") out.step = reason.step;
  return out;
}

/** `GET /templates/{id}/builds/{buildID}/status?logsOffset=`: the status and the log entries from `logsOffset`. */
export async function getBuildStatus(
  client: ApiClient,
  templateID: string,
  buildID: string,
  logsOffset: number | undefined,
  signal?: AbortSignal,
): Promise<TemplateBuildStatusResponse> {
  const res = await callApi<unknown>(
    client,
    {
      method: "GET",
      path: `/templates/${encodeURIComponent(templateID)}/builds/${encodeURIComponent(buildID)}/status`,
      query: { logsOffset: logsOffset === undefined ? undefined : String(logsOffset) },
      signal,
    },
    BuildError,
  );
  if (res.body === undefined) throw new BuildError("Failed to get build status");
  const data = record(res.body);
  const out: TemplateBuildStatusResponse = {
    buildID: String(data.buildID ?? buildID),
    templateID: String(data.templateID ?? templateID),
    // Any other value is kept: the wait loop ends on it with "Unknown build error occurred.", as E2B's does.
    status: String(data.status) as TemplateBuildStatus,
    logEntries: Array.isArray(data.logEntries) ? data.logEntries.map(logEntryFrom) : [],
    logs: Array.isArray(data.logs) ? data.logs.map(String) : [],
  };
  const reason = reasonFrom(data.reason);
  if (reason) out.reason = reason;
  return out;
}

export interface WaitOptions {
  onBuildLogs?: (entry: LogEntry) => void;
  /** Every status response, for progress displays. */
  onStatus?: (status: TemplateBuildStatusResponse) => void;
  /** Poll interval while building (200 ms, as E2B). */
  pollIntervalMs?: number;
  /** Maps a failed build's `reason.step` to the user's call that recorded it. */
  stackTraceOfStep?: (step: string) => string | undefined;
  signal?: AbortSignal;
}

/**
 * Polls the status from `logsOffset` 0 until the build is `ready` (returns) or `error` (throws BuildError with
 * the reason), handing each new log entry to `onBuildLogs`. Once the build ended it drains the remaining log
 * pages (the server returns at most 100 entries per call) before returning.
 */
export async function waitForBuildFinish(
  client: ApiClient,
  templateID: string,
  buildID: string,
  opts: WaitOptions = {},
): Promise<TemplateBuildStatusResponse> {
  let logsOffset = 0;
  const poll = async () => {
    opts.signal?.throwIfAborted();
    const status = await getBuildStatus(client, templateID, buildID, logsOffset, opts.signal);
    logsOffset += status.logEntries.length;
    for (const entry of status.logEntries) opts.onBuildLogs?.(entry);
    opts.onStatus?.(status);
    return status;
  };
  for (;;) {
    const status = await poll();
    if (status.status === "ready" || status.status === "error") {
      let tail = status;
      while (tail.logEntries.length > 0) tail = await poll();
      if (status.status === "ready") return status;
      const step = status.reason?.step;
      throw new BuildError(
        status.reason?.message ?? "Unknown error",
        step === undefined ? undefined : opts.stackTraceOfStep?.(step),
      );
    }
    if (status.status !== "building" && status.status !== "waiting") {
      throw new BuildError("Unknown build error occurred.");
    }
    await sleep(opts.pollIntervalMs ?? 200, opts.signal);
  }
}
