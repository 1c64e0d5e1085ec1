import { readFileSync } from "node:fs";
import { request as httpsRequest } from "node:https";
import { GiveUp, type ManagedChild, waitFor } from "./services.js";

/** Gives up at once (with the end of its log) when a process the cluster waits for has exited. */
export function assertRunning(child: ManagedChild): void {
  if (child.child.exitCode !== null || child.child.signalCode !== null) {
    const tail = readFileSync(child.logFile, "utf8").split("\n").slice(-15).join("\n");
    throw new GiveUp(
      `${child.name} exited (${child.child.exitCode ?? child.child.signalCode}); its log ends:\n${tail}`,
    );
  }
}

/** Until `url` answers at all (any status), while `child` runs. */
export async function waitForHttp(child: ManagedChild, url: string, timeoutMs: number): Promise<void> {
  await waitFor(
    `${child.name} at ${url}`,
    async () => {
      assertRunning(child);
      await fetch(url);
      return true;
    },
    timeoutMs,
  );
}

/** Until the proxy answers `api.<domain>/health` through TLS with the configured certificate (verified). */
export async function waitForTls(
  child: ManagedChild,
  host: string,
  port: number,
  tls: { readonly domain: string; readonly caFile?: string },
): Promise<void> {
  const ca = tls.caFile ? readFileSync(tls.caFile) : undefined;
  await waitFor(
    `${child.name} at https://api.${tls.domain} (${host}:${port})`,
    async () => {
      assertRunning(child);
      const status = await new Promise<number>((resolve, reject) => {
        const req = httpsRequest(
          { host, port, path: "/health", servername: `api.${tls.domain}`, headers: { Host: `api.${tls.domain}` }, ca },
          (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          },
        );
        req.on("error", reject);
        req.end();
      });
      return status === 200 ? true : undefined;
    },
    30_000,
  );
}
