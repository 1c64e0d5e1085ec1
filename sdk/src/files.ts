import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  EventType,
  type EntryInfo as RpcEntryInfo,
  FileType as RpcFileType,
} from "@warren/proto/filesystem/filesystem_pb";
import type { ConnectionConfig } from "./config.js";

type BodyInit = NonNullable<RequestInit["body"]>;

import { approvalHeaders, type EnvdEndpoint, type EnvdRpc, userHeaders } from "./envd.js";
import { envdHttpError, InvalidArgumentError, rpcError, SandboxError } from "./errors.js";
import { combine } from "./process-stream.js";
import { type FileUrlOpts, fileUrl } from "./signature.js";
import { WatchHandle } from "./watch.js";

export enum FileType {
  FILE = "file",
  DIR = "dir",
  SYMLINK = "symlink",
}

export enum FilesystemEventType {
  CHMOD = "chmod",
  CREATE = "create",
  REMOVE = "remove",
  RENAME = "rename",
  WRITE = "write",
}

export interface WriteInfo {
  name: string;
  type?: FileType;
  path: string;
  metadata?: Record<string, string>;
}

export interface EntryInfo extends WriteInfo {
  size: number;
  mode: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime?: Date;
  symlinkTarget?: string;
}

export interface FilesystemEvent {
  name: string;
  type: FilesystemEventType;
  entry?: EntryInfo;
}

export type WriteData = string | ArrayBuffer | Uint8Array | Blob | ReadableStream<Uint8Array>;
export type WriteEntry = { path: string; data: WriteData };

export interface FilesystemRequestOpts {
  user?: string;
  /**
   * Warren extra: an approval (from `ApprovalRequiredError.approvalId`, approved by an approver) for this one
   * write, rename, remove or makeDir that the team's exec policy holds for review.
   */
  approval?: string;
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface FilesystemWriteOpts extends FilesystemRequestOpts {
  gzip?: boolean;
  useOctetStream?: boolean;
  metadata?: Record<string, string>;
}

export interface FilesystemReadOpts extends FilesystemRequestOpts {
  gzip?: boolean;
}

export interface WatchOpts extends FilesystemRequestOpts {
  /** Lifetime of the watch in ms; Warren's default is none (0). */
  timeoutMs?: number;
  recursive?: boolean;
  includeEntry?: boolean;
  allowNetworkMounts?: boolean;
  onExit?: (err?: Error) => void | Promise<void>;
}

const EVENT_TYPES: ReadonlyMap<EventType, FilesystemEventType> = new Map([
  [EventType.CREATE, FilesystemEventType.CREATE],
  [EventType.WRITE, FilesystemEventType.WRITE],
  [EventType.REMOVE, FilesystemEventType.REMOVE],
  [EventType.RENAME, FilesystemEventType.RENAME],
  [EventType.CHMOD, FilesystemEventType.CHMOD],
]);

/** sandbox.files: read, write, list and watch the sandbox's filesystem. */
export class Filesystem {
  /** @internal */
  constructor(
    private readonly rpc: EnvdRpc,
    private readonly endpoint: EnvdEndpoint,
    private readonly config: ConnectionConfig,
  ) {}

  read(path: string, opts?: FilesystemReadOpts & { format?: "text" }): Promise<string>;
  read(path: string, opts: FilesystemReadOpts & { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, opts: FilesystemReadOpts & { format: "blob" }): Promise<Blob>;
  read(path: string, opts: FilesystemReadOpts & { format: "stream" }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: FilesystemReadOpts & { format?: "text" | "bytes" | "blob" | "stream" } = {},
  ): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    const url = new URL(`${this.endpoint.url}/files`);
    url.searchParams.set("path", path);
    if (opts.user !== undefined) url.searchParams.set("username", opts.user);
    const headers: Record<string, string> = { ...this.endpoint.headers };
    if (opts.gzip) headers["Accept-Encoding"] = "gzip";
    const format = opts.format ?? "text";
    // A stream is bounded by the caller's signal only: it may be read for as long as it takes.
    const signal = format === "stream" ? opts.signal : this.config.signal(opts.requestTimeoutMs, opts.signal);
    const res = await fetch(url, { headers, signal });
    if (!res.ok) throw envdHttpError(res.status, await res.text(), { files: true });
    switch (format) {
      case "bytes":
        return new Uint8Array(await res.arrayBuffer());
      case "blob":
        return await res.blob();
      case "stream":
        return res.body ?? new ReadableStream({ start: (c) => c.close() });
      default:
        return await res.text();
    }
  }

  write(path: string, data: WriteData, opts?: FilesystemWriteOpts): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: FilesystemWriteOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteData | FilesystemWriteOpts,
    maybeOpts?: FilesystemWriteOpts,
  ): Promise<WriteInfo | WriteInfo[]> {
    if (typeof pathOrFiles === "string") {
      if (dataOrOpts === undefined) throw new InvalidArgumentError("write of a path needs data");
      const written = await this.upload([{ path: pathOrFiles, data: dataOrOpts as WriteData }], maybeOpts ?? {}, true);
      const first = written[0];
      if (!first) throw new SandboxError("the sandbox reported no file written");
      return first;
    }
    return this.upload(pathOrFiles, (dataOrOpts as FilesystemWriteOpts | undefined) ?? {}, false);
  }

  writeFiles(files: WriteEntry[], opts: FilesystemWriteOpts = {}): Promise<WriteInfo[]> {
    return this.upload(files, opts, false);
  }

  private async upload(files: WriteEntry[], opts: FilesystemWriteOpts, single: boolean): Promise<WriteInfo[]> {
    if (files.length === 0) return [];
    const headers: Record<string, string> = {
      ...this.endpoint.headers,
      ...metadataHeaders(opts.metadata),
      ...approvalHeaders(opts.approval),
    };
    const octet = opts.useOctetStream ?? (opts.gzip || files.some((f) => f.data instanceof ReadableStream));
    if (octet) {
      // One request per file, in parallel; results in input order.
      const results = await Promise.all(
        files.map((file) => this.post(file.path, opts, headers, octetBody(file.data, opts.gzip === true), true)),
      );
      return results.flat();
    }
    const form = new FormData();
    for (const file of files) form.append("file", await blobOf(file.data), file.path);
    return this.post(single ? files[0]?.path : undefined, opts, headers, form, false);
  }

  private async post(
    path: string | undefined,
    opts: FilesystemWriteOpts,
    headers: Record<string, string>,
    body: BodyInit,
    octet: boolean,
  ): Promise<WriteInfo[]> {
    const url = new URL(`${this.endpoint.url}/files`);
    if (opts.user !== undefined) url.searchParams.set("username", opts.user);
    if (path !== undefined) url.searchParams.set("path", path);
    const requestHeaders = { ...headers };
    if (octet) {
      requestHeaders["Content-Type"] = "application/octet-stream";
      if (opts.gzip) requestHeaders["Content-Encoding"] = "gzip";
    }
    const res = await fetch(url, {
      method: "POST",
      headers: requestHeaders,
      body,
      signal: this.config.signal(opts.requestTimeoutMs, opts.signal),
      ...(body instanceof ReadableStream ? { duplex: "half" } : {}),
    } as RequestInit);
    if (!res.ok) throw envdHttpError(res.status, await res.text(), { files: true });
    const entries = (await res.json()) as Array<{
      name: string;
      path: string;
      type?: string;
      metadata?: Record<string, string>;
    }>;
    if (!Array.isArray(entries) || entries.length === 0)
      throw new SandboxError("Expected to receive information about written file");
    return entries.map((e) => ({
      name: e.name,
      path: e.path,
      type: e.type === "dir" ? FileType.DIR : FileType.FILE,
      ...(e.metadata && Object.keys(e.metadata).length > 0 ? { metadata: e.metadata } : {}),
    }));
  }

  async list(path: string, opts: FilesystemRequestOpts & { depth?: number } = {}): Promise<EntryInfo[]> {
    const depth = opts.depth ?? 1;
    if (depth < 1) throw new InvalidArgumentError("depth should be at least one");
    try {
      const res = await this.rpc.filesystem.listDir({ path, depth }, this.callOpts(opts));
      return res.entries.filter((e) => e.type !== RpcFileType.UNSPECIFIED).map(entryInfo);
    } catch (error) {
      throw rpcError(error, { files: true });
    }
  }

  /** `true` if the directory was created, `false` if it already existed. */
  async makeDir(path: string, opts: FilesystemRequestOpts = {}): Promise<boolean> {
    try {
      await this.rpc.filesystem.makeDir({ path }, this.callOpts(opts));
      return true;
    } catch (error) {
      if (error instanceof ConnectError && error.code === Code.AlreadyExists) return false;
      throw rpcError(error, { files: true });
    }
  }

  async rename(oldPath: string, newPath: string, opts: FilesystemRequestOpts = {}): Promise<EntryInfo> {
    try {
      const res = await this.rpc.filesystem.move({ source: oldPath, destination: newPath }, this.callOpts(opts));
      if (!res.entry) throw new SandboxError("Expected to receive information about moved object");
      return entryInfo(res.entry);
    } catch (error) {
      throw rpcError(error, { files: true });
    }
  }

  async remove(path: string, opts: FilesystemRequestOpts = {}): Promise<void> {
    try {
      await this.rpc.filesystem.remove({ path }, this.callOpts(opts));
    } catch (error) {
      throw rpcError(error, { files: true });
    }
  }

  async exists(path: string, opts: FilesystemRequestOpts = {}): Promise<boolean> {
    try {
      await this.rpc.filesystem.stat({ path }, this.callOpts(opts));
      return true;
    } catch (error) {
      if (error instanceof ConnectError && error.code === Code.NotFound) return false;
      throw rpcError(error, { files: true });
    }
  }

  async getInfo(path: string, opts: FilesystemRequestOpts = {}): Promise<EntryInfo> {
    try {
      const res = await this.rpc.filesystem.stat({ path }, this.callOpts(opts));
      if (!res.entry) throw new SandboxError("Expected to receive information about the object");
      return entryInfo(res.entry);
    } catch (error) {
      throw rpcError(error, { files: true });
    }
  }

  /** Watches a directory; `onEvent` gets every change until `handle.stop()` (or the optional timeout). */
  async watchDir(
    path: string,
    onEvent: (event: FilesystemEvent) => void | Promise<void>,
    opts: WatchOpts = {},
  ): Promise<WatchHandle> {
    const controller = new AbortController();
    const timeoutMs = opts.timeoutMs ?? 0;
    const events = this.rpc.filesystem.watchDir(
      {
        path,
        recursive: opts.recursive ?? false,
        includeEntry: opts.includeEntry ?? false,
        allowNetworkMounts: opts.allowNetworkMounts ?? false,
      },
      {
        signal: combine(controller.signal, opts.signal),
        headers: { ...userHeaders(opts.user), "Keepalive-Ping-Interval": "30" },
        timeoutMs: timeoutMs > 0 ? timeoutMs : undefined,
      },
    );
    const iterator = events[Symbol.asyncIterator]();
    try {
      const first = await iterator.next();
      if (first.done || first.value.event.case !== "start") throw new SandboxError("Expected start event");
    } catch (error) {
      controller.abort();
      throw rpcError(error, { files: true });
    }
    return new WatchHandle(controller, iterator, onEvent, opts.onExit, (e) => {
      const type = EVENT_TYPES.get(e.type);
      if (type === undefined) return undefined;
      return { name: e.name, type, ...(e.entry ? { entry: entryInfo(e.entry) } : {}) };
    });
  }

  /** A URL that uploads to `path` without headers (E2B's v1 signature when the sandbox is secured). */
  uploadUrl(path?: string, opts: FileUrlOpts = {}): Promise<string> {
    return fileUrl(this.endpoint, path, "write", opts);
  }

  /** A URL that downloads `path` without headers (E2B's v1 signature when the sandbox is secured). */
  downloadUrl(path: string, opts: FileUrlOpts = {}): Promise<string> {
    return fileUrl(this.endpoint, path, "read", opts);
  }

  private callOpts(opts: FilesystemRequestOpts) {
    return {
      headers: { ...userHeaders(opts.user), ...approvalHeaders(opts.approval) },
      signal: this.config.signal(opts.requestTimeoutMs, opts.signal),
    };
  }
}

export function entryInfo(e: RpcEntryInfo): EntryInfo {
  const type =
    e.type === RpcFileType.DIRECTORY ? FileType.DIR : e.type === RpcFileType.SYMLINK ? FileType.SYMLINK : FileType.FILE;
  return {
    name: e.name,
    type,
    path: e.path,
    size: Number(e.size),
    mode: e.mode,
    permissions: e.permissions,
    owner: e.owner,
    group: e.group,
    ...(e.modifiedTime ? { modifiedTime: timestampDate(e.modifiedTime) } : {}),
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: e.symlinkTarget } : {}),
    ...(Object.keys(e.metadata).length > 0 ? { metadata: { ...e.metadata } } : {}),
  };
}

function metadataHeaders(metadata: Record<string, string> | undefined): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [key, value] of Object.entries(metadata ?? {})) {
    if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(key)) throw new InvalidArgumentError(`invalid metadata key '${key}'`);
    if (!/^[\x20-\x7e]*$/.test(value)) throw new InvalidArgumentError(`invalid metadata value for key '${key}'`);
    headers[`X-Metadata-${key}`] = value;
  }
  return headers;
}

async function blobOf(data: WriteData): Promise<Blob> {
  if (data instanceof Blob) return data;
  if (data instanceof ReadableStream) return await new Response(data).blob();
  return new Blob([data as ArrayBuffer]);
}

function octetBody(data: WriteData, gzip: boolean): BodyInit {
  const stream: ReadableStream<Uint8Array> =
    data instanceof ReadableStream ? data : (new Response(data as BodyInit).body as ReadableStream<Uint8Array>);
  return gzip ? (stream.pipeThrough(new CompressionStream("gzip")) as ReadableStream<Uint8Array>) : stream;
}
