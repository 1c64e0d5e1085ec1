import type { ApiRequestBody, ApiSchema } from "@warren/proto/openapi";
import { ApiClient, bodyCode, bodyMessage, requireString } from "./api.js";
import type { ConnectionOpts } from "./config.js";
import { forkError, SandboxError, SandboxNotFoundError } from "./errors.js";
import { connectionFrom, type SandboxApiOpts, type SandboxConnection } from "./sandbox-api.js";

/* Wire types from the api's OpenAPI document (type-only imports); answers are read defensively (`Partial`). */
type SnapshotWire = ApiSchema<"SnapshotInfo">;
type ForkWire = NonNullable<ApiRequestBody<"/sandboxes/{sandboxID}/fork", "post">>;
type SnapshotRequestWire = NonNullable<ApiRequestBody<"/sandboxes/{sandboxID}/snapshots", "post">>;
type Writable<T> = { -readonly [K in keyof T]: T[K] };

export interface CreateSnapshotOpts extends SandboxApiOpts {
  /** A name for the snapshot; a name used again moves to the new snapshot. */
  name?: string;
}

/**
 * A snapshot: `snapshotId` works as the template of `Sandbox.create`. E2B's fields plus what Warren's
 * api tells (absent when a server does not send them).
 */
export interface SnapshotInfo {
  /** `<namespace>/<name>:<tag>` when named, else `<id>:<tag>`. */
  snapshotId: string;
  /** Full names of the snapshot (empty when unnamed). */
  names: string[];
  /** Warren extra: the sandbox it was taken from (listings only). */
  sandboxId?: string;
  /** Warren extra: when it was taken (listings only). */
  createdAt?: Date;
  /** Warren extra: whether it holds processes and memory (false: files only; sandboxes from it boot fresh). */
  memory?: boolean;
  /** Warren extra: its size on the node's disk. */
  sizeBytes?: number;
}

export interface SnapshotListOpts extends Omit<SandboxApiOpts, "signal"> {
  /** Only snapshots taken from this sandbox. */
  sandboxId?: string;
  /** Only the snapshot with this name or id (optionally namespace- and tag-qualified). */
  name?: string;
  /** Page size (the server's default: 100). */
  limit?: number;
  nextToken?: string;
}

export interface SandboxForkOpts extends ConnectionOpts {
  /** How many sandboxes to make from the one capture. Default 1. */
  count?: number;
  /** Lifetime of each fork in ms (sent rounded up to seconds). Default: the server's. */
  timeoutMs?: number;
}

/** `POST /sandboxes/{id}/snapshots`: captures the sandbox (it keeps running) as a snapshot. */
export async function createSnapshot(sandboxId: string, opts: CreateSnapshotOpts = {}): Promise<SnapshotInfo> {
  const body: SnapshotRequestWire = opts.name ? { name: opts.name } : {};
  const res = await new ApiClient(opts).request<Partial<SnapshotWire>>({
    method: "POST",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}/snapshots`,
    body,
    expect: [404],
    requestTimeoutMs: opts.requestTimeoutMs,
    signal: opts.signal,
  });
  if (res.status === 404 || bodyCode(res.body) === 404) {
    throw new SandboxNotFoundError(`Sandbox ${sandboxId} not found`, { statusCode: 404 });
  }
  return snapshotInfoFrom(res.body);
}

/** `DELETE /templates/{id}`: `false` when there is no such snapshot. */
export async function deleteSnapshot(snapshotId: string, opts: SandboxApiOpts = {}): Promise<boolean> {
  const res = await new ApiClient(opts).request({
    method: "DELETE",
    path: `/templates/${encodeURIComponent(snapshotId)}`,
    expect: [404],
    requestTimeoutMs: opts.requestTimeoutMs,
    signal: opts.signal,
  });
  return !(res.status === 404 || bodyCode(res.body) === 404);
}

/**
 * `POST /sandboxes/{id}/fork`: one capture, then `count` sandboxes, each reported on its own — its
 * connection, or the error that kept it from starting. An unknown source is a SandboxNotFoundError.
 */
export async function forkSandbox(
  sandboxId: string,
  opts: SandboxForkOpts = {},
): Promise<Array<SandboxConnection | Error>> {
  const body: Writable<ForkWire> = {};
  if (opts.count !== undefined) body.count = opts.count;
  if (opts.timeoutMs !== undefined) body.timeout = Math.ceil(opts.timeoutMs / 1000);
  const res = await new ApiClient(opts).request<unknown>({
    method: "POST",
    path: `/sandboxes/${encodeURIComponent(sandboxId)}/fork`,
    body,
    expect: [404],
    requestTimeoutMs: opts.requestTimeoutMs,
    signal: opts.signal,
  });
  if (res.status === 404) {
    throw new SandboxNotFoundError(bodyMessage(res.body) || `Sandbox ${sandboxId} not found`, { statusCode: 404 });
  }
  if (!Array.isArray(res.body)) throw new SandboxError(`fork answered ${bodyMessage(res.body) || "a non-list"}`);
  return res.body.map(forkResultFrom);
}

/** Each entry of the answer: the document's ForkResult (a sandbox, or an error), read defensively. */
type ForkResultWire = {
  sandbox?: Partial<ApiSchema<"Sandbox">> | null;
  error?: { code?: unknown; message?: unknown } | null;
};

function forkResultFrom(entry: unknown): SandboxConnection | Error {
  const result: ForkResultWire = typeof entry === "object" && entry !== null ? entry : {};
  const { sandbox, error } = result;
  if (typeof error === "object" && error !== null) {
    const { code, message } = error;
    return forkError(typeof code === "number" ? code : 500, typeof message === "string" ? message : "");
  }
  if (typeof sandbox !== "object" || sandbox === null) return new SandboxError("Failed to start forked sandbox");
  return connectionFrom(sandbox);
}

export function snapshotInfoFrom(body: Partial<SnapshotWire>): SnapshotInfo {
  const info: SnapshotInfo = {
    snapshotId: requireString(body.snapshotID, "snapshotID"),
    names: Array.isArray(body.names) ? body.names.map(String) : [],
  };
  if (typeof body.sandboxID === "string" && body.sandboxID !== "") info.sandboxId = body.sandboxID;
  if (typeof body.createdAt === "string") info.createdAt = new Date(body.createdAt);
  if (typeof body.memory === "boolean") info.memory = body.memory;
  if (typeof body.sizeBytes === "number") info.sizeBytes = body.sizeBytes;
  return info;
}

/** Pages of `GET /snapshots` (E2B's SnapshotPaginator), newest first: `while (p.hasNext) await p.nextItems()`. */
export class SnapshotPaginator {
  private _hasNext = true;
  private _nextToken: string | undefined;

  constructor(private readonly opts: SnapshotListOpts = {}) {
    this._nextToken = opts.nextToken;
  }

  get hasNext(): boolean {
    return this._hasNext;
  }

  get nextToken(): string | undefined {
    return this._nextToken;
  }

  async nextItems(opts: SandboxApiOpts = {}): Promise<SnapshotInfo[]> {
    if (!this._hasNext) throw new SandboxError("No more items to fetch");
    const res = await new ApiClient({ ...this.opts, ...opts }).request<Array<Partial<SnapshotWire>>>({
      method: "GET",
      path: "/snapshots",
      query: {
        sandboxID: this.opts.sandboxId,
        name: this.opts.name,
        limit: this.opts.limit === undefined ? undefined : String(this.opts.limit),
        nextToken: this._nextToken,
      },
      signal: opts.signal,
    });
    if (!Array.isArray(res.body)) throw new SandboxError(`list answered ${bodyMessage(res.body) || "a non-list"}`);
    const next = res.headers.get("x-next-token");
    this._nextToken = next || undefined;
    this._hasNext = Boolean(next);
    return res.body.map(snapshotInfoFrom);
  }
}
