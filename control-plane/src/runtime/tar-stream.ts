import { spawn } from "node:child_process";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

/**
 * What tar must keep for a tree to come back as it was (a snapshot layer, a template's root filesystem): owners as
 * numbers, modes, xattrs (overlayfs opaque dirs, file capabilities), ACLs, devices.
 */
export const TAR_KEEP = ["--xattrs", "--xattrs-include=*", "--numeric-owner", "--acls"];

/**
 * `tar --create <args>` as a byte stream (snapshot exports of both drivers). Only a consumer that stops before the
 * end kills tar; after its last byte tar is left to exit by itself, and a non-zero exit throws naming `what`.
 */
export async function* tarCreateStream(args: readonly string[], what: string): AsyncGenerator<Uint8Array> {
  const tar = spawn("tar", ["--create", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  tar.stderr.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exited = new Promise<number>((resolve) => tar.once("close", (code) => resolve(code ?? 1)));
  let streamed = false;
  try {
    for await (const chunk of tar.stdout) yield chunk as Buffer;
    streamed = true;
  } finally {
    if (!streamed) tar.kill("SIGKILL");
  }
  const code = await exited;
  if (code !== 0) throw new Error(`tar of ${what} failed (${code}): ${stderr.trim()}`);
}

/**
 * `tar --extract <args>` reading `data`; a non-zero exit throws naming `what`. tar stops reading at the archive's
 * end marker and may exit before the record padding after it has been written: its stdin closing early ("Premature
 * close", EPIPE) is then no error, when tar itself succeeded (the caller checks a digest over the whole stream).
 */
export async function tarExtractStream(
  args: readonly string[],
  data: AsyncIterable<Uint8Array>,
  what: string,
): Promise<void> {
  const tar = spawn("tar", ["--extract", ...args], { stdio: ["pipe", "ignore", "pipe"] });
  let stderr = "";
  tar.stderr.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exited = new Promise<number>((resolve) => tar.once("close", (code) => resolve(code ?? 1)));
  const piped = await pipeline(Readable.from(data), tar.stdin).then(
    () => undefined,
    (error: NodeJS.ErrnoException) => {
      const closedByTar = error.code === "EPIPE" || error.code === "ERR_STREAM_PREMATURE_CLOSE";
      if (!closedByTar) tar.kill("SIGKILL");
      return { error, closedByTar };
    },
  );
  const code = await exited;
  if (code !== 0) throw new Error(`unpacking ${what} failed (${code}): ${stderr.trim()}`);
  if (piped && !piped.closedByTar) throw piped.error;
}
