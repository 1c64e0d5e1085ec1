#!/usr/bin/env node
import { ProbeError } from "../runtime/microvm/probe.js";
import { selectRuntime } from "../runtime/microvm/select.js";
import { ConfigError, loadNodeAgentConfig } from "./config.js";
import { createLogger } from "./log.js";
import { startNodeAgent } from "./node-agent.js";

async function main(): Promise<void> {
  const config = loadNodeAgentConfig(process.env);
  const log = createLogger("node-agent", { level: config.logLevel, base: { nodeId: config.nodeId } });
  if (process.getuid?.() !== 0) throw new ConfigError("the node agent must run as root (namespaces, mounts, cgroups)");
  // The capability probe picks the driver (WARREN_DRIVER, default auto) and logs why.
  const { microvm } = await selectRuntime(config, log);
  const running = microvm ? await startNodeAgent(config, log, microvm) : await startNodeAgent(config, log);
  let stopping = false;
  const shutdown = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info(
      config.killOnStop
        ? "shutting down and killing every sandbox"
        : "shutting down; sandboxes keep running and are re-adopted at the next start",
      { signal },
    );
    running.stop({ killAll: config.killOnStop }).then(
      () => {
        log.info("node agent stopped");
        process.exit(0);
      },
      (error: unknown) => {
        log.error("shutdown failed", { error: String(error) });
        process.exit(1);
      },
    );
  };
  process.once("SIGTERM", () => shutdown("SIGTERM"));
  process.once("SIGINT", () => shutdown("SIGINT"));
}

main().catch((error: unknown) => {
  if (error instanceof ConfigError || error instanceof ProbeError) {
    const why = error instanceof ProbeError && error.reasons.length > 0 ? ` (${error.reasons.join("; ")})` : "";
    process.stderr.write(`${error.message}${why}\n`);
    process.exit(2);
  }
  process.stderr.write(
    `${JSON.stringify({ time: new Date().toISOString(), level: "error", component: "node-agent", msg: "failed to start", error: error instanceof Error ? error.message : String(error) })}\n`,
  );
  process.exit(1);
});
