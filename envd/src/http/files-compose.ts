import { randomUUID } from "node:crypto";
import { constants, createReadStream, type WriteStream } from "node:fs";
import { open, rename, stat, unlink } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { basename, dirname } from "node:path";
import { pipeline } from "node:stream/promises";
import type { EnvdContext } from "../context.js";
import { fromFsError, invalidArgument, notFound } from "../errors.js";
import { ensureDirectory } from "../filesystem/operations.js";
import { AccessChecker } from "../filesystem/permissions.js";
import { FILE_MODE } from "../filesystem/write-file.js";
import { resolveUserPath } from "../paths.js";
import type { SandboxUser } from "../users.js";
import { readJsonBody } from "./body.js";
import { fileUser } from "./files.js";
import { sendError, sendJson } from "./respond.js";

/** E2B's ComposeRequest, parsed once at the edge. */
export interface ComposeRequest {
  readonly destination: string;
  readonly sourcePaths: readonly string[];
  readonly username: string | undefined;
}

/** The entry answered for the composed file (E2B's EntryInfo). */
export interface ComposedEntry {
  path: string;
  name: string;
  type: "file";
}

/** Validates the body in E2B's order: empty `source_paths` before a missing `destination`. */
export function parseComposeRequest(body: unknown): ComposeRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw invalidArgument("invalid request body: expected a JSON object");
  }
  const { destination, source_paths: sourcePaths, username } = body as Record<string, unknown>;
  if (sourcePaths !== undefined && sourcePaths !== null) {
    if (!Array.isArray(sourcePaths) || !sourcePaths.every((path) => typeof path === "string")) {
      throw invalidArgument("invalid request body: source_paths must be an array of strings");
    }
  }
  if (!Array.isArray(sourcePaths) || sourcePaths.length === 0) throw invalidArgument("source_paths must not be empty");
  if (destination !== undefined && destination !== null && typeof destination !== "string") {
    throw invalidArgument("invalid request body: destination must be a string");
  }
  if (!destination) throw invalidArgument("destination is required");
  if (username !== undefined && username !== null && typeof username !== "string") {
    throw invalidArgument("invalid request body: username must be a string");
  }
  return { destination, sourcePaths, username: username ?? undefined };
}

/**
 * Resolves every source and checks, before anything is written, that it is a regular file
 * the user may read and remove. Missing sources are 404 as E2B words it.
 */
async function checkSources(
  request: ComposeRequest,
  destination: string,
  user: SandboxUser,
  access: AccessChecker,
): Promise<string[]> {
  const sources: string[] = [];
  for (const raw of request.sourcePaths) {
    const path = resolveUserPath(raw, user);
    if (path === destination) throw invalidArgument(`source path '${raw}' cannot be the same as destination`);
    await access.assertReachable(path);
    const info = await stat(path).catch((error: unknown) => {
      const errno = (error as NodeJS.ErrnoException).code;
      throw errno === "ENOENT" || errno === "ENOTDIR"
        ? notFound(`source file not found: ${raw}`)
        : fromFsError(error, path);
    });
    if (!info.isFile()) throw invalidArgument(`source path is not a regular file: ${raw}`);
    await access.assertReadable(path);
    await access.assertUnlinkable(path);
    sources.push(path);
  }
  return sources;
}

/**
 * The destination is written as an upload is (E2B's compose does the same): its missing
 * parents are created for the user and no permission of theirs is needed there.
 */
async function prepareDestination(destination: string, user: SandboxUser): Promise<void> {
  const existing = await stat(destination).catch(() => undefined);
  if (existing?.isDirectory()) throw invalidArgument(`path '${destination}' is a directory`);
  await ensureDirectory(dirname(destination), user);
}

/** Every source's bytes in order; a read failure names the source it came from. */
async function* contentsOf(sources: readonly string[]): AsyncGenerator<Buffer> {
  for (const source of sources) {
    try {
      for await (const chunk of createReadStream(source)) yield chunk as Buffer;
    } catch (error) {
      throw fromFsError(error, source);
    }
  }
}

/**
 * Streams every source into `sink` through one pipeline (one set of listeners on the sink,
 * however many sources) and ends it; answers the bytes written.
 */
async function concatenate(sources: readonly string[], sink: WriteStream, sinkPath: string): Promise<number> {
  try {
    await pipeline(contentsOf(sources), sink);
  } catch (error) {
    throw fromFsError(error, sinkPath);
  }
  return sink.bytesWritten;
}

/**
 * Writes the concatenation to `<destination>.e2b-compose.<uuid>.tmp` (owned by the user,
 * 0644) and renames it over the destination, so a failure never destroys an existing
 * destination; the temporary file is removed on any failure and sources are left alone.
 */
async function writeComposed(
  sources: readonly string[],
  destination: string,
  temporary: string,
  user: SandboxUser,
): Promise<number> {
  const handle = await open(temporary, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, FILE_MODE).catch(
    (error: unknown) => {
      throw fromFsError(error, temporary);
    },
  );
  try {
    try {
      await handle.chown(user.uid, user.gid);
      await handle.chmod(FILE_MODE);
    } catch (error) {
      throw fromFsError(error, temporary);
    }
    // The stream owns the handle from here and closes it when it finishes or fails.
    const size = await concatenate(sources, handle.createWriteStream(), temporary);
    await rename(temporary, destination).catch((error: unknown) => {
      throw fromFsError(error, destination);
    });
    return size;
  } catch (error) {
    await unlink(temporary).catch(() => {});
    throw error;
  } finally {
    await handle.close().catch(() => {});
  }
}

/**
 * POST /files/compose (E2B's PostFilesCompose): concatenates `source_paths` in order into
 * `destination` as the requesting user, then deletes the sources. server.ts routes here
 * after its access-token check.
 */
export async function handleFilesCompose(req: IncomingMessage, res: ServerResponse, ctx: EnvdContext): Promise<void> {
  try {
    const request = parseComposeRequest(await readJsonBody(req));
    const user = fileUser(ctx, request.username);
    const access = new AccessChecker(user);
    const destination = resolveUserPath(request.destination, user);
    const sources = await checkSources(request, destination, user, access);
    const temporary = `${destination}.e2b-compose.${randomUUID()}.tmp`;
    await prepareDestination(destination, user);
    const size = await writeComposed(sources, destination, temporary, user);
    // As in E2B, the composed file stands once renamed; a source that cannot be removed is left.
    await Promise.all(sources.map((source) => unlink(source).catch(() => {})));
    ctx.log.info("files composed", { path: destination, sources: sources.length, size });
    const entry: ComposedEntry = { path: destination, name: basename(destination), type: "file" };
    sendJson(res, 200, entry);
  } catch (error) {
    sendError(res, error);
    if (res.statusCode >= 500) {
      ctx.log.warn("/files/compose request failed", { status: res.statusCode, error: (error as Error).message });
    }
  }
}
