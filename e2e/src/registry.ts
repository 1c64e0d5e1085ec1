import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, type ManagedChild, startChild, waitFor } from "./services.js";

/**
 * A private OCI registry on loopback: Debian's `docker-registry` (the CNCF distribution registry), storing under
 * `dir`. The template store of multi-node tests, and the source of images they build templates from.
 */
export async function startRegistry(dir: string): Promise<{ host: string; process: ManagedChild }> {
  const port = await freePort();
  const storage = join(dir, "storage");
  mkdirSync(storage, { recursive: true });
  const config = join(dir, "config.yml");
  writeFileSync(
    config,
    [
      "version: 0.1",
      "log:",
      "  level: warn",
      "storage:",
      "  filesystem:",
      `    rootdirectory: ${storage}`,
      "  delete:",
      "    enabled: true",
      "http:",
      `  addr: 127.0.0.1:${port}`,
      "",
    ].join("\n"),
  );
  const registry = startChild("registry", "docker-registry", ["serve", config], { logDir: join(dir, "logs") });
  const host = `127.0.0.1:${port}`;
  await waitFor(
    "the registry",
    async () => ((await fetch(`http://${host}/v2/`).catch(() => undefined))?.status === 200 ? true : undefined),
    15_000,
  );
  return { host, process: registry };
}
