import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createLogger } from "@warren/control-plane/dist/node-agent/log.js";
import { withFileLock } from "@warren/control-plane/dist/runtime/file-lock.js";
import { TemplateStore } from "@warren/control-plane/dist/templates/store.js";
import { LocalCluster } from "@warren/local";

/** The shipped templates the tests start sandboxes from. */
const SHIPPED = ["base", "code-interpreter-v1"];
/** Where every test's node agent finds them: the node agent's defaults (WARREN_TEMPLATES_DIR, WARREN_UID_BASE). */
const TEMPLATES_DIR = "/var/lib/warren/templates";
const UID_BASE = 100_000;

/**
 * Vitest's global setup: the shipped templates are made by the master's template builder (templates/store.ts), so
 * a node agent a test starts without a master could never get them. Before any test runs, a one-node cluster of
 * the host's defaults makes those this host's cache lacks, exactly as `warren up` does; then it stops. Nothing to
 * do (no cluster started) once they are there. WARREN_TEST_PREBUILD=0 skips it (a unit test on a host without them).
 */
export default async function prebuildShippedTemplates(): Promise<void> {
  if (process.env.WARREN_TEST_PREBUILD === "0") return;
  const store = new TemplateStore({
    dir: TEMPLATES_DIR,
    uidBase: UID_BASE,
    log: createLogger("prebuild", { level: "error" }),
  });
  if (SHIPPED.every((id) => store.ready(id))) return;
  // One prebuild at a time on a host (two vitest runs starting together): the second finds the templates made.
  await withFileLock(join(TEMPLATES_DIR, "locks", "prebuild.lock"), () => prebuild(store));
}

async function prebuild(store: TemplateStore): Promise<void> {
  const missing = SHIPPED.filter((id) => !store.ready(id));
  if (missing.length === 0) return;
  const say = (line: string) => console.log(`[prebuild] ${line}`);
  say(`this host's template cache lacks ${missing.join(", ")}: a one-node cluster has the template builder make them`);
  const dataDir = mkdtempSync(join(tmpdir(), "warren-prebuild-"));
  const started = Date.now();
  const cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 0,
    instancePrefix: "lp",
    nodeCidr: () => "10.206.0.0/22",
    readyTemplates: missing,
    onProgress: say,
    // As every test's agents: no forwarding for sandboxes, DNS nowhere, nothing shared through a store.
    env: {
      WARREN_PREBUILD_TEMPLATES: missing.join(","),
      WARREN_UPLINK_FORWARDING: "0",
      WARREN_DNS_UPSTREAM: "127.0.0.1:9",
      WARREN_SHARE_SHIPPED_TEMPLATES: "off",
    },
  });
  try {
    await cluster.start();
    say(`${missing.join(", ")} ready in ${Math.round((Date.now() - started) / 1000)} s`);
  } finally {
    await cluster.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
  const still = missing.filter((id) => !store.ready(id));
  if (still.length > 0) throw new Error(`the prebuild cluster did not leave ${still.join(", ")} in ${TEMPLATES_DIR}`);
}
