import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { type Readable, Transform, type Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import { ApiError } from "./errors.js";

/**
 * One volume-content operation, run by `python/volume_fs.py` chrooted into the volume's folder: whatever symlinks
 * sandboxes leave in a volume, a path resolves inside it (Node has no openat/RESOLVE_IN_ROOT to do it here without
 * a race between checking a path and using it).
 */
export type VolumeOp = "stat" | "list" | "mkdir" | "write" | "read" | "remove" | "chmeta";

const SCRIPT = fileURLToPath(new URL("../../python/volume_fs.py", import.meta.url));
/** The system's interpreter, not a version manager's shim on PATH (pyenv's costs ~1 s per start). */
const PYTHON = existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";

export interface VolumeOpOptions {
  readonly uid?: number;
  readonly gid?: number;
  readonly mode?: number;
  readonly force?: boolean;
  readonly depth?: number;
  readonly quotaBytes?: number;
}

/** A refusal of the helper (its status and message) or a failure to run it. */
function refusal(stderr: string, code: number | null): ApiError {
  const line = stderr.trim().split("\n").at(-1) ?? "";
  if (code === 3) {
    try {
      const parsed = JSON.parse(line) as { status: number; message: string };
      return new ApiError(parsed.status, parsed.message, String(parsed.status));
    } catch {
      // fall through: not the helper's refusal line
    }
  }
  return new ApiError(500, `the volume operation failed (exit ${code}): ${line.slice(0, 300)}`, "internal");
}

function start(root: string, op: VolumeOp, path: string, options: VolumeOpOptions) {
  const child = spawn(PYTHON, ["-I", "-S", SCRIPT, root, op, path, JSON.stringify(options)], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    if (stderr.length < 10_000) stderr += chunk;
  });
  const exited = new Promise<number | null>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => resolve(code));
  });
  return { child, exited, stderr: () => stderr };
}

/** Runs an operation that answers JSON (everything but `read`); `input` is the file's content for `write`. */
export async function runVolumeOp(
  root: string,
  op: Exclude<VolumeOp, "read">,
  path: string,
  options: VolumeOpOptions,
  input?: Readable,
): Promise<unknown> {
  const { child, exited, stderr } = start(root, op, path, options);
  let stdout = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk;
  });
  if (input) {
    // The helper may refuse before or while reading its input (a missing parent, a full volume): a broken pipe is
    // its answer, not ours. The request stays whole (not destroyed with the pipe) and the rest of its body is read
    // and dropped, so the client gets the refusal on a sound connection instead of a reset.
    // An input that fails midway (the client went away) ends without the closing frame: the helper discards it.
    await sendFramed(input, child.stdin);
  } else child.stdin.end();
  const code = await exited;
  if (code !== 0) throw refusal(stderr(), code);
  return stdout.trim() === "" ? null : JSON.parse(stdout);
}

const MAX_FRAME = 1 << 20;

/**
 * A write's content as the helper reads it: each chunk after its 4-byte big-endian length, then a 0 length. Only
 * an upload that arrived whole carries that end, so an interrupted one can never become a shorter file.
 */
function framer(): Transform {
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      for (let at = 0; at < chunk.length; at += MAX_FRAME) {
        const part = chunk.subarray(at, at + MAX_FRAME);
        const header = Buffer.alloc(4);
        header.writeUInt32BE(part.length);
        this.push(header);
        this.push(part);
      }
      done();
    },
    flush(done) {
      done(null, Buffer.alloc(4));
    },
  });
}

/**
 * Sends `input` framed to the helper's stdin; resolves when the helper has it all, has stopped reading, or the
 * input failed. An input that fails midway (the client went away) closes the pipe without the end frame. The
 * helper stopping early (a refusal) is its answer: the input is then unhooked, never destroyed, and the rest of it
 * read and dropped.
 */
function sendFramed(input: Readable, stdin: Writable): Promise<void> {
  return new Promise((resolve) => {
    const frames = framer();
    const stop = () => {
      input.unpipe(frames);
      frames.unpipe(stdin);
      if (!input.readableEnded && !input.destroyed) input.resume();
      resolve();
    };
    input.once("error", () => {
      stdin.destroy();
      resolve();
    });
    stdin.once("error", stop);
    stdin.once("close", stop);
    stdin.once("finish", () => resolve());
    input.pipe(frames).pipe(stdin);
  });
}

/**
 * Streams a file to `out` after `onStart` (headers): nothing is sent before the helper has read the first bytes or
 * finished, so a refusal is still an error status.
 */
export async function readVolumeFile(root: string, path: string, onStart: () => Writable): Promise<void> {
  const { child, exited, stderr } = start(root, "read", path, {});
  child.stdin.end();
  const first = await new Promise<Buffer | null>((resolve) => {
    child.stdout.once("data", (chunk: Buffer) => {
      child.stdout.pause();
      resolve(chunk);
    });
    child.stdout.once("end", () => resolve(null));
  });
  if (first === null) {
    const code = await exited;
    if (code !== 0) throw refusal(stderr(), code);
    onStart().end();
    return;
  }
  const out = onStart();
  out.write(first);
  await pipeline(child.stdout, out);
  const code = await exited;
  if (code !== 0) throw new ApiError(500, `reading '${path}' failed midway: ${stderr().slice(0, 300)}`, "internal");
}
