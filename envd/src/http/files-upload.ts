import type { IncomingMessage, ServerResponse } from "node:http";
import { basename } from "node:path";
import type { Readable } from "node:stream";
import { createGunzip } from "node:zlib";
import { invalidArgument } from "../errors.js";
import { type Metadata, validateMetadata } from "../filesystem/metadata.js";
import { writeUploadedFile } from "../filesystem/write-file.js";
import { resolveUserPath } from "../paths.js";
import type { SandboxUser } from "../users.js";
import { readMultipartFiles } from "./files-multipart.js";
import { sendJson } from "./respond.js";

const MULTIPART = "multipart/form-data";
const OCTET_STREAM = "application/octet-stream";
const METADATA_HEADER_PREFIX = "x-metadata-";

/** One written file in the upload response; `metadata` only when there is some (clients deepEqual it). */
export interface UploadedEntry {
  path: string;
  name: string;
  type: "file";
  metadata?: Record<string, string>;
}

/** `X-Metadata-<key>: value` headers; the first of repeated headers wins. */
function metadataFromHeaders(req: IncomingMessage): Metadata {
  const pairs: Array<[string, string]> = [];
  for (const [name, values] of Object.entries(req.headersDistinct)) {
    const value = values?.[0];
    if (name.startsWith(METADATA_HEADER_PREFIX) && value !== undefined) {
      pairs.push([name.slice(METADATA_HEADER_PREFIX.length), value]);
    }
  }
  return validateMetadata(pairs);
}

/** The request body with its Content-Encoding removed (gzip only). */
function decodedBody(req: IncomingMessage): Readable {
  const encoding = (req.headers["content-encoding"] ?? "").trim().toLowerCase();
  if (encoding === "" || encoding === "identity") return req;
  if (encoding !== "gzip" && encoding !== "x-gzip") {
    throw invalidArgument(`unsupported Content-Encoding '${encoding}', supported: gzip`);
  }
  const gunzip = createGunzip();
  // Corrupt input may fail before a consumer listens; it reads the error from the stream's state.
  gunzip.on("error", () => {});
  req.on("error", (error) => gunzip.destroy(error));
  req.on("close", () => {
    if (!req.readableEnded) gunzip.destroy(new Error("the request ended before the body was complete"));
  });
  return req.pipe(gunzip);
}

/** After a failed upload the rest of the body is read and dropped, so the client gets the error. */
function abandonBody(req: IncomingMessage, body: Readable): void {
  req.unpipe();
  if (body !== req) body.destroy();
  if (!req.readableEnded && !req.destroyed) req.resume();
}

function uploadedEntry(path: string, metadata: Metadata): UploadedEntry {
  const entry: UploadedEntry = { path, name: basename(path), type: "file" };
  if (metadata.length > 0) entry.metadata = Object.fromEntries(metadata);
  return entry;
}

/**
 * POST /files (E2B-PROTOCOL.md §4.5): multipart/form-data (every `file` part, its target the
 * `path` query or else the part's filename) or application/octet-stream (target = `path`),
 * optionally gzip-encoded, streamed to disk by root for `user` as E2B's envd does (no permission
 * of theirs needed; what is written becomes theirs). Answers the written entries in order.
 */
export async function receiveUpload(
  req: IncomingMessage,
  res: ServerResponse,
  user: SandboxUser,
  queryPath: string | undefined,
): Promise<void> {
  const contentType = req.headers["content-type"] ?? "";
  const mediaType = (contentType.split(";")[0] ?? "").trim().toLowerCase();
  if (mediaType !== MULTIPART && mediaType !== OCTET_STREAM) {
    throw invalidArgument(`unsupported content type '${contentType}': send ${MULTIPART} or ${OCTET_STREAM}`);
  }
  if (mediaType === OCTET_STREAM && !queryPath) {
    throw invalidArgument("path query parameter is required for raw body upload");
  }
  const metadata = metadataFromHeaders(req);
  const body = decodedBody(req);
  const uploaded: UploadedEntry[] = [];
  const targets = new Set<string>();

  const write = async (target: string, data: Readable) => {
    const path = resolveUserPath(target, user);
    if (targets.has(path)) {
      throw invalidArgument(`you cannot upload multiple files to the same path '${path}' in one upload request`);
    }
    targets.add(path);
    await writeUploadedFile(path, data, user, metadata);
    uploaded.push(uploadedEntry(path, metadata));
  };

  try {
    if (mediaType === OCTET_STREAM) {
      await write(queryPath as string, body);
    } else {
      await readMultipartFiles(body, contentType, async (part) => {
        const target = queryPath ?? part.filename;
        if (!target) {
          part.data.resume();
          throw invalidArgument("multipart part 'file' has no filename and no path query parameter was given");
        }
        await write(target, part.data);
      });
      if (uploaded.length === 0) throw invalidArgument("the form has no part named 'file'");
    }
  } catch (error) {
    abandonBody(req, body);
    throw error;
  }
  sendJson(res, 200, uploaded);
}
