import { request } from "node:http";
import type { Logger } from "./log.js";

/**
 * Sends envd one Start of `bash -l -c true` as the default user over its own listening socket and
 * reads the stream to its end: the Connect handler, JSON codec, spawn path, setpriv and the login
 * shell's files are then compiled and cached before a client's first command. Best effort: a
 * failure is logged and changes nothing.
 */
export function warmUp(port: number, accessToken: string | undefined, log: Logger): Promise<void> {
  const message = Buffer.from(
    JSON.stringify({ process: { cmd: "/bin/bash", args: ["-l", "-c", "true"] }, stdin: false }),
  );
  const envelope = Buffer.alloc(5 + message.length);
  envelope.writeUInt32BE(message.length, 1);
  message.copy(envelope, 5);
  const started = performance.now();
  return new Promise((resolve) => {
    const req = request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/process.Process/Start",
        headers: {
          "Content-Type": "application/connect+json",
          "Connect-Protocol-Version": "1",
          "Connect-Timeout-Ms": "10000",
          ...(accessToken ? { "X-Access-Token": accessToken } : {}),
        },
      },
      (res) => {
        res.resume();
        res.once("end", () => {
          log.info("warm-up done", { ms: Math.round(performance.now() - started), status: res.statusCode });
          resolve();
        });
      },
    );
    req.once("error", (error) => {
      log.warn("warm-up failed", { error: error.message });
      resolve();
    });
    req.end(envelope);
  });
}
