import { constants } from "node:fs";
import { type FileHandle, open, stat, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import type { Readable, Writable } from "node:stream";
import { type EnvdError, fromFsError, invalidArgument } from "../errors.js";
import type { SandboxUser } from "../users.js";
import { type Metadata, replaceMetadata } from "./metadata.js";
import { ensureDirectory } from "./operations.js";

/** Mode of files envd creates for a user, set explicitly so the umask does not matter. */
export const FILE_MODE = 0o644;

function errnoOf(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException | undefined)?.code;
}

/** Where a written file came from went wrong (client side), as opposed to the disk. */
function uploadBodyError(error: unknown): EnvdError {
  const message = error instanceof Error ? error.message : String(error);
  return invalidArgument(`error reading upload body: ${message}`);
}

/**
 * Copies `source` into `sink` (which closes its file when done) and settles once the sink
 * has closed. Unlike stream.pipeline it never destroys the source: that may be the HTTP
 * request, whose socket must survive to carry the error response. Source failures are the
 * client's (400); sink failures the disk's.
 */
function copy(source: Readable, sink: Writable, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let failure: EnvdError | undefined;
    const fail = (error: EnvdError) => {
      if (failure) return;
      failure = error;
      source.unpipe(sink);
      sink.destroy();
    };
    const onSourceError = (error: Error) => fail(uploadBodyError(error));
    const onSourceClose = () => {
      if (!source.readableEnded) fail(uploadBodyError(new Error("the body ended before the file was complete")));
    };
    source.on("error", onSourceError);
    source.on("close", onSourceClose);
    sink.on("error", (error) => fail(fromFsError(error, path)));
    sink.on("close", () => {
      source.off("error", onSourceError);
      source.off("close", onSourceClose);
      if (failure) reject(failure);
      else if (sink.writableFinished) resolve();
      else reject(uploadBodyError(new Error("the file was closed before the body ended")));
    });
    if (source.errored) onSourceError(source.errored);
    else if (source.destroyed && !source.readableEnded) onSourceClose();
    else source.pipe(sink);
  });
}

/**
 * Opens `path` for the upload as root: created 0644 if new (reported, so a failed upload
 * can remove it again), else opened as it is. Nothing is truncated yet.
 */
async function openTarget(path: string): Promise<{ handle: FileHandle; created: boolean }> {
  try {
    const handle = await open(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, FILE_MODE);
    return { handle, created: true };
  } catch (error) {
    if (errnoOf(error) !== "EEXIST") throw fromFsError(error, path);
  }
  try {
    // Non-blocking, so a FIFO swapped in since the caller's stat fails (ENXIO) instead of hanging.
    return { handle: await open(path, constants.O_WRONLY | constants.O_NONBLOCK), created: false };
  } catch (error) {
    throw fromFsError(error, path);
  }
}

/**
 * Hands the opened file to `user` as E2B's envd does with every upload target, new or
 * overwritten, then empties an existing one. No-op changes are skipped: each change is an
 * inotify ATTRIB (a CHMOD event for watchers). Emptying only now means a file that cannot
 * be handed over (a procfs file refuses chown) is left as it was.
 */
async function prepareTarget(handle: FileHandle, created: boolean, user: SandboxUser, path: string): Promise<void> {
  try {
    const current = await handle.stat();
    if (!current.isFile()) throw invalidArgument(`path '${path}' is not a regular file`);
    if (current.uid !== user.uid || current.gid !== user.gid) await handle.chown(user.uid, user.gid);
    if (created && (current.mode & 0o7777) !== FILE_MODE) await handle.chmod(FILE_MODE);
    if (!created) await handle.truncate(0);
  } catch (error) {
    throw fromFsError(error, path);
  }
}

/**
 * Writes one uploaded file with E2B's semantics: envd writes as root on the user's behalf,
 * so no permission of the user is needed. Missing parents are created 0755 and the file
 * 0644, an existing file is rewritten in place (so watchers see a WRITE of the file itself,
 * its mode kept), and what was written belongs to `user` afterwards. Its metadata is
 * replaced by `metadata`. A directory or another non-regular file (device, FIFO, socket)
 * at `path` is `invalid_argument`, and a file this call created is removed again if the
 * upload fails.
 */
export async function writeUploadedFile(
  path: string,
  source: Readable,
  user: SandboxUser,
  metadata: Metadata,
): Promise<void> {
  const existing = await stat(path).catch((error: unknown) => {
    if (errnoOf(error) === "ENOENT") return undefined;
    throw fromFsError(error, path);
  });
  if (existing?.isDirectory()) throw invalidArgument(`path '${path}' is a directory`);
  if (existing && !existing.isFile()) throw invalidArgument(`path '${path}' is not a regular file`);
  if (!existing) await ensureDirectory(dirname(path), user);

  const { handle, created } = await openTarget(path);
  try {
    await prepareTarget(handle, created, user, path);
    // The stream closes the handle when it finishes or fails; the close below is then a no-op.
    await copy(source, handle.createWriteStream(), path);
    await replaceMetadata(path, metadata);
  } catch (error) {
    if (created) await unlink(path).catch(() => {});
    throw error;
  } finally {
    await handle.close().catch(() => {});
  }
}
