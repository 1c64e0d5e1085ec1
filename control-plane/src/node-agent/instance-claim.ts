import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type HeldFileLock, tryFileLock } from "../runtime/file-lock.js";
import { ConfigError } from "./config.js";

/** Host-wide, whatever each agent's state directory: the names it guards are host-wide too. */
export const INSTANCE_CLAIMS_DIR = "/run/warren/instances";

/**
 * An agent restarted right after its predecessor was killed may find the predecessor's claim still held for a few
 * milliseconds (the lock's holder notices its parent's death through a closed pipe): it waits this long for it.
 */
const PREDECESSOR_GRACE_MS = 5_000;

/**
 * Claims `instance` for this node agent on this host, for as long as it runs. An agent's network namespaces, veths,
 * cgroups and firewall chains are named after its instance, and at start it removes those it has no record of: a
 * second agent under the same name would tear down the first one's sandboxes (two test clusters sharing a name
 * did, in CI, as resets and refused connections in the middle of their tests). The claim is an flock, so an agent
 * that dies frees its name at once.
 */
export async function claimInstance(
  instance: string,
  dir = INSTANCE_CLAIMS_DIR,
  waitMs = PREDECESSOR_GRACE_MS,
): Promise<HeldFileLock> {
  const held = await tryFileLock(join(dir, `${instance}.lock`), waitMs);
  const ownerFile = join(dir, `${instance}.pid`);
  if (!held) {
    const owner = (await readFile(ownerFile, "utf8").catch(() => "")).trim();
    throw new ConfigError(
      `another node agent on this host${owner ? ` (pid ${owner})` : ""} runs instance '${instance}': give each agent its own WARREN_INSTANCE (its namespaces, veths, cgroups and firewall chains are named after it)`,
    );
  }
  await writeFile(ownerFile, `${process.pid}\n`);
  return held;
}
