import { spawn } from "node:child_process";

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
