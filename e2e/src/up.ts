#!/usr/bin/env node
/**
 * `node e2e/dist/up.js`: Warren on this machine, in the foreground. Starts PostgreSQL and Redis
 * (private ones under .warren/ unless DATABASE_URL / REDIS_URL are set), the master, the api, a node
 * agent and the proxy, creates a team and API key, prints the environment a user needs and writes it
 * to .warren/env. Ctrl-C (or SIGTERM) stops everything and leaves no sandbox behind.
 */
import { LocalCluster } from "./cluster.js";

const cluster = new LocalCluster({
  databaseUrl: process.env.DATABASE_URL || undefined,
  redisUrl: process.env.REDIS_URL || undefined,
  apiPort: Number(process.env.WARREN_API_PORT ?? 3000),
  proxyPort: Number(process.env.WARREN_PROXY_PORT ?? 3002),
  onProgress: (line) => process.stderr.write(`warren: ${line}\n`),
});

let stopping = false;
async function shutdown(signal: string): Promise<void> {
  if (stopping) return;
  stopping = true;
  process.stderr.write(`warren: ${signal}: stopping (sandboxes are removed)\n`);
  await cluster.stop();
  process.exit(0);
}
process.on("SIGINT", () => void shutdown("SIGINT"));
process.on("SIGTERM", () => void shutdown("SIGTERM"));

try {
  const env = await cluster.start();
  const file = cluster.writeEnvFile();
  process.stdout.write(
    [
      "",
      "Warren is up. Point the official e2b SDK (or Warren's) at it:",
      "",
      ...Object.entries(env)
        .filter(([key]) => key !== "WARREN_ADMIN_TOKEN")
        .map(([key, value]) => `  export ${key}=${value}`),
      "",
      `(also in ${file}; the admin token is there too). Ctrl-C stops Warren.`,
      "",
    ].join("\n"),
  );
} catch (error) {
  process.stderr.write(`warren: failed to start: ${(error as Error).message}\n`);
  process.exit(1);
}
