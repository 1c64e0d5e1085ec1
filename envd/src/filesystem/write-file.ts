import { constants } from "node:fs";
import { type FileHandle, open, stat, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import type { Readable, Writable } from "node:stream";
import { type EnvdError, fromFsError, invalidArgument } from "../errors.js";
import type { SandboxUser } from "../users.js";
import { type Metadata, replaceMetadata } from "./metadata.js";
import { ensureDirectory } from "./operations.js";
import type { AccessChecker } from "./permissions.js";

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

/** Opens `path` for the upload: created 0644 if new (reported), else truncated once writable. */
async function openTarget(path: string, access: AccessChecker): Promise<{ handle: FileHandle; created: boolean }> {
  try {
    const handle = await open(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, FILE_MODE);
    return { handle, created: true };
  } catch (error) {
    if (errnoOf(error) !== "EEXIST") throw fromFsError(error, path);
  }
  await access.assertWritable(path);
  try {
    return { handle: await open(path, constants.O_WRONLY | constants.O_TRUNC), created: false };
  } catch (error) {
    throw fromFsError(error, path);
  }
}

/**
 * Writes one uploaded file as E2B's envd does: parents created (0755, owned by the user),
 * the file created 0644 or truncated and rewritten in place (so watchers see a WRITE of
 * the file itself), owned by the user (an existing file only when root writes it), and
 * its metadata replaced by `metadata`. A file this call created is removed again if the
 * upload fails.
 */
export async function writeUploadedFile(
  path: string,
  source: Readable,
  user: SandboxUser,
  access: AccessChecker,
  metadata: Metadata,
): Promise<void> {
  await access.assertReachable(path);
  const existing = await stat(path).catch((error: unknown) => {
    if (errnoOf(error) === "ENOENT") return undefined;
    throw fromFsError(error, path);
  });
  if (existing?.isDirectory()) throw invalidArgument(`path '${path}' is a directory`);
  if (existing && !existing.isFile()) throw invalidArgument(`path '${path}' is not a regular file`);
  if (existing) await access.assertWritable(path);
  else {
    await ensureDirectory(dirname(path), user, access);
    await access.assertCreatable(path);
  }

  const { handle, created } = await openTarget(path, access);
  try {
    try {
      // Each change is an inotify ATTRIB (a CHMOD event for watchers), so skip the no-ops. A
      // user writing into someone else's (writable) file does not get to own it; root does.
      const current = await handle.stat();
      const mayTakeOver = created || user.uid === 0;
      if (mayTakeOver && (current.uid !== user.uid || current.gid !== user.gid)) await handle.chown(user.uid, user.gid);
      if (created && (current.mode & 0o7777) !== FILE_MODE) await handle.chmod(FILE_MODE);
    } catch (error) {
      throw fromFsError(error, path);
    }
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
