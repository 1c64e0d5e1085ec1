import { request } from "node:http";
import type { Logger } from "./log.js";

/**
 * Sends envd, over its own listening socket, one Start of `bash -l -c true` as the default user (read to its end)
 * and then an empty `POST /init` (which changes nothing): the Connect handler, JSON codec, spawn path, launcher and
 * the login shell's files, and the /init path a create waits for, are then compiled and cached before a client's
 * first call (a warm-pool sandbox's /init took ~6 ms cold). Best effort: a failure is logged and changes nothing.
 */
export async function warmUp(port: number, accessToken: string | undefined, log: Logger): Promise<void> {
  const message = Buffer.from(
    JSON.stringify({ process: { cmd: "/bin/bash", args: ["-l", "-c", "true"] }, stdin: false }),
  );
  const envelope = Buffer.alloc(5 + message.length);
  envelope.writeUInt32BE(message.length, 1);
  message.copy(envelope, 5);
  const started = performance.now();
  const token: Record<string, string> = accessToken ? { "X-Access-Token": accessToken } : {};
  try {
    const start = await send(port, "/process.Process/Start", envelope, {
      "Content-Type": "application/connect+json",
      "Connect-Protocol-Version": "1",
      "Connect-Timeout-Ms": "10000",
      ...token,
    });
    const init = await send(port, "/init", Buffer.from("{}"), { "Content-Type": "application/json", ...token });
    log.info("warm-up done", { ms: Math.round(performance.now() - started), status: start, initStatus: init });
  } catch (error) {
    log.warn("warm-up failed", { error: (error as Error).message });
  }
}

/** One request to envd itself, read to its end; resolves with the status. */
function send(port: number, path: string, body: Buffer, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method: "POST", path, headers }, (res) => {
      res.resume();
      res.once("end", () => resolve(res.statusCode ?? 0));
      res.once("error", reject);
    });
    req.once("error", reject);
    req.end(body);
  });
}
