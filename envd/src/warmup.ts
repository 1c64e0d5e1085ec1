import { request } from "node:http";
import type { Logger } from "./log.js";

/**
 * Rounds of the command path after the first, for a sandbox warmed ahead of demand (a warm pool's): envd's own code
 * (the Connect handler, the codec, the spawner's requests, the stream's events) runs in V8's interpreter until it
 * has run a few times, and a pooled sandbox's first command paid that (the SDK's first `commands.run('true')` on a
 * claimed sandbox p50 25.6–27.2 ms with one round, 17.8 ms with these; the second 18–21 ms either way). They start
 * `/bin/true` itself: the login shell's files are cached by the first round, and an exec of `true` costs a fraction
 * of a login shell. ~40 ms more of envd's CPU per pooled start (340 → 380 ms here), so a cold start a create waits
 * for (warmed after its `/init`, maybe in a burst that is short of CPU) does not take them.
 */
export const AHEAD_OF_DEMAND_ROUNDS = 5;

/**
 * Sends envd one Start of `bash -l -c true` as the default user over its own listening socket and
 * reads the stream to its end, then `laterRounds` Starts of `/bin/true`: the Connect handler, JSON codec, spawn
 * path, setpriv and the login shell's files are then compiled and cached before a client's first command. Best
 * effort: a failure is logged and changes nothing.
 */
export async function warmUp(
  port: number,
  accessToken: string | undefined,
  log: Logger,
  laterRounds: number,
): Promise<void> {
  const started = performance.now();
  let status = await startOnce(port, accessToken, log, { cmd: "/bin/bash", args: ["-l", "-c", "true"] });
  for (let round = 0; round < laterRounds && status === 200; round++)
    status = await startOnce(port, accessToken, log, { cmd: "/bin/true", args: [] });
  log.info("warm-up done", { ms: Math.round(performance.now() - started), status });
}

/** One Start of `process`, its stream read to the end; the response's status (0: the request failed). */
function startOnce(
  port: number,
  accessToken: string | undefined,
  log: Logger,
  process: { cmd: string; args: string[] },
): Promise<number> {
  const message = Buffer.from(JSON.stringify({ process, stdin: false }));
  const envelope = Buffer.alloc(5 + message.length);
  envelope.writeUInt32BE(message.length, 1);
  message.copy(envelope, 5);
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
        res.once("end", () => resolve(res.statusCode ?? 0));
      },
    );
    req.once("error", (error) => {
      log.warn("warm-up failed", { error: error.message });
      resolve(0);
    });
    req.end(envelope);
  });
}
