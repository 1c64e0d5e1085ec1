import type { Stats } from "node:fs";
import { type FileHandle, open, stat } from "node:fs/promises";
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from "node:http";
import { basename } from "node:path";
import { type Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { promisify } from "node:util";
import { createGzip, deflateRaw, constants as zlibConstants } from "node:zlib";
import { fromFsError, invalidArgument, notFound } from "../errors.js";
import { AccessChecker } from "../filesystem/permissions.js";
import { resolveUserPath } from "../paths.js";
import type { SandboxUser } from "../users.js";
import { contentTypeByExtension, sniffContentType } from "./files-content-type.js";
import { negotiateEncoding, parseRange, type RangeRequest } from "./files-negotiation.js";
import { sendJsonError } from "./respond.js";

/** Files up to this size are read whole before the answer (its Content-Length is then what was read). */
const READ_WHOLE_MAX_BYTES = 1 << 20;
const READ_CHUNK_BYTES = 64 * 1024;
const SNIFF_BYTES = 512;
const COMPRESSION_SAMPLE_BYTES = 64 * 1024;
const deflateRawAsync = promisify(deflateRaw);

/** `inline; filename="a.txt"`, or the RFC 5987 form for names a quoted string cannot carry. */
export function contentDisposition(name: string): string {
  if (/^[\x20-\x7e]*$/.test(name) && !/["\\]/.test(name)) return `inline; filename="${name}"`;
  const encoded = encodeURIComponent(name).replace(/['()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  return `inline; filename*=utf-8''${encoded}`;
}

async function contentTypeOf(path: string, handle: FileHandle, size: number): Promise<string> {
  const byName = contentTypeByExtension(path);
  if (byName) return byName;
  const head = Buffer.alloc(Math.min(SNIFF_BYTES, size));
  const { bytesRead } = await handle.read(head, 0, head.length, 0);
  return sniffContentType(head.subarray(0, bytesRead));
}

/** Whether the first 64 KiB shrink by a tenth with fast deflate. */
async function worthCompressing(handle: FileHandle, size: number): Promise<boolean> {
  const sample = Buffer.alloc(Math.min(COMPRESSION_SAMPLE_BYTES, size));
  const { bytesRead } = await handle.read(sample, 0, sample.length, 0);
  const packed = await deflateRawAsync(sample.subarray(0, bytesRead), { level: zlibConstants.Z_BEST_SPEED });
  return packed.length < bytesRead * 0.9;
}

/** If-Modified-Since at one-second precision, as HTTP dates have. */
function notModified(req: IncomingMessage, info: Stats): boolean {
  const since = req.headers["if-modified-since"];
  if (!since || req.headers["if-none-match"]) return false;
  const time = Date.parse(since);
  return Number.isFinite(time) && Math.floor(info.mtimeMs / 1000) * 1000 <= time;
}

/** If-Range with a date honours the Range only while the file is unchanged. */
function rangeStillValid(req: IncomingMessage, lastModified: string): boolean {
  const ifRange = req.headers["if-range"];
  return ifRange === undefined || ifRange === lastModified;
}

/**
 * GET /files (E2B-PROTOCOL.md §4.4): streams a file the user may read. Identity responses
 * carry Content-Length and honour Range; gzip is used when Accept-Encoding prefers it, no
 * Range is asked for and the content compresses. A file over READ_WHOLE_MAX_BYTES is never held in memory.
 */
export async function serveDownload(
  req: IncomingMessage,
  res: ServerResponse,
  user: SandboxUser,
  rawPath: string,
): Promise<void> {
  const path = resolveUserPath(rawPath, user);
  const handle = await openForReading(path, new AccessChecker(user));
  try {
    await respondWithFile(req, res, path, handle);
  } finally {
    // A read stream closes the handle itself; closing again is a no-op.
    await handle.close().catch(() => {});
  }
}

/** Missing ⇒ 404 as E2B words it, a directory or special file ⇒ 400, unreadable ⇒ 403. */
async function openForReading(path: string, access: AccessChecker): Promise<FileHandle> {
  await access.assertReachable(path);
  const info = await stat(path).catch((error: unknown) => {
    const errno = (error as NodeJS.ErrnoException).code;
    throw errno === "ENOENT" || errno === "ENOTDIR"
      ? notFound(`path '${path}' does not exist`)
      : fromFsError(error, path);
  });
  if (info.isDirectory()) throw invalidArgument(`path '${path}' is a directory`);
  if (!info.isFile()) throw invalidArgument(`path '${path}' is not a regular file`);
  await access.assertReadable(path);
  return open(path, "r").catch((error: unknown) => {
    throw fromFsError(error, path);
  });
}

async function respondWithFile(
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  handle: FileHandle,
): Promise<void> {
  const opened = await handle.stat();
  const size = opened.size;
  const lastModified = opened.mtime.toUTCString();
  if (notModified(req, opened)) {
    res.writeHead(304, { "Last-Modified": lastModified, Vary: "Accept-Encoding" }).end();
    return;
  }
  const headers: OutgoingHttpHeaders = {
    "Content-Disposition": contentDisposition(basename(path)),
    "Content-Type": await contentTypeOf(path, handle, size),
    "Last-Modified": lastModified,
    Vary: "Accept-Encoding",
  };
  if (size === 0) {
    // The SDK reads an empty body from Content-Length: 0, whatever the format.
    res.writeHead(200, { ...headers, "Content-Length": 0 }).end();
    return;
  }
  const rangeHeader = rangeStillValid(req, lastModified) ? req.headers.range : undefined;
  const choice = negotiateEncoding(req.headers["accept-encoding"]);
  if (choice === undefined) {
    sendJsonError(res, 406, "no acceptable encoding found, supported: [gzip identity]");
    return;
  }
  // A Range is answered in identity, like E2B's envd does; so is a file gzip would not
  // shrink (already compressed), since zlib then only costs CPU.
  const identity =
    choice.coding === "identity" ||
    (choice.identityAllowed && (rangeHeader !== undefined || !(await worthCompressing(handle, size))));
  if (identity) {
    await sendIdentity(res, handle, headers, parseRange(rangeHeader, size), size);
    return;
  }
  res.writeHead(200, { ...headers, "Content-Encoding": "gzip" });
  await send(res, handle.createReadStream({ highWaterMark: READ_CHUNK_BYTES }), true);
}

async function sendIdentity(
  res: ServerResponse,
  handle: FileHandle,
  headers: OutgoingHttpHeaders,
  range: RangeRequest,
  size: number,
): Promise<void> {
  if (range.kind === "unsatisfiable") {
    res.writeHead(416, { "Content-Range": `bytes */${size}`, "Content-Type": "text/plain; charset=utf-8" });
    res.end("invalid range: failed to overlap\n");
    return;
  }
  const start = range.kind === "partial" ? range.start : 0;
  const end = range.kind === "partial" ? range.end : size - 1;
  const rangeHeaders = range.kind === "partial" ? { "Content-Range": `bytes ${start}-${end}/${size}` } : {};
  const status = range.kind === "partial" ? 206 : 200;
  if (range.kind !== "partial" && size <= READ_WHOLE_MAX_BYTES) {
    // Read before answering, so Content-Length is what was read: a file rewritten meanwhile (a counter or a log a
    // process truncates and writes again) may have shrunk since its size was taken.
    const whole = await readUpTo(handle, size);
    res.writeHead(status, { ...headers, "Accept-Ranges": "bytes", "Content-Length": whole.length }).end(whole);
    return;
  }
  res.writeHead(status, { ...headers, ...rangeHeaders, "Accept-Ranges": "bytes", "Content-Length": end - start + 1 });
  await send(res, handle.createReadStream({ start, end, highWaterMark: READ_CHUNK_BYTES }), false, end - start + 1);
}

/** Up to `size` bytes from the start of the file: fewer when it shrank since its size was taken. */
async function readUpTo(handle: FileHandle, size: number): Promise<Buffer> {
  const buffer = Buffer.allocUnsafe(size);
  let filled = 0;
  while (filled < size) {
    const { bytesRead } = await handle.read(buffer, filled, size - filled, filled);
    if (bytesRead === 0) break;
    filled += bytesRead;
  }
  return buffer.subarray(0, filled);
}

/**
 * Pipes the file out; a client that goes away mid-download just ends it (the stream closes the fd). When the answer
 * promised `length` bytes and the file ended sooner (it shrank while being read), the connection is closed: the
 * client gets an error instead of waiting for bytes that never come.
 */
async function send(res: ServerResponse, stream: Readable, gzip: boolean, length?: number): Promise<void> {
  try {
    // Fastest level: inside a sandbox the CPU, not the link, is what a download waits on.
    if (gzip) await pipeline(stream, createGzip({ level: zlibConstants.Z_BEST_SPEED }), res);
    else if (length === undefined) await pipeline(stream, res);
    else await pipeline(stream, promisedLength(length), res);
  } catch {
    stream.destroy();
    res.destroy();
  }
}

/** Passes bytes on, and fails at the end when fewer than `length` came (before the answer is ended). */
function promisedLength(length: number): Transform {
  let passed = 0;
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      passed += chunk.length;
      done(null, chunk);
    },
    flush(done) {
      done(passed < length ? new Error(`the file ended after ${passed} of ${length} bytes`) : null);
    },
  });
}
