#!/usr/bin/env node
import { runMain } from "@warren/platform/main";
import { ProbeError } from "../runtime/microvm/probe.js";
import { selectRuntime } from "../runtime/microvm/select.js";
import { ConfigError, loadNodeAgentConfig } from "./config.js";
import { createLogger } from "./log.js";
import { startNodeAgent } from "./node-agent.js";

runMain(
  async () => {
    const config = loadNodeAgentConfig(process.env);
    const log = createLogger("node-agent", { level: config.logLevel, base: { nodeId: config.nodeId } });
    if (process.getuid?.() !== 0)
      throw new ConfigError("the node agent must run as root (namespaces, mounts, cgroups)");
    // The capability probe picks the driver (WARREN_DRIVER, default auto) and logs why.
    const { microvm } = await selectRuntime(config, log);
    const running = microvm ? await startNodeAgent(config, log, microvm) : await startNodeAgent(config, log);
    log.info(
      config.killOnStop
        ? "on SIGTERM every sandbox is killed"
        : "on SIGTERM sandboxes keep running and are re-adopted at the next start",
    );
    return { stop: () => running.stop({ killAll: config.killOnStop }), log };
  },
  {
    name: "warren-node-agent",
    log: createLogger("node-agent"),
    // The probe's refusal (WARREN_DRIVER=microvm without KVM) is the operator's to fix, with its reasons.
    explainUsageError: (error) =>
      error instanceof ProbeError
        ? `${error.message}${error.reasons.length > 0 ? ` (${error.reasons.join("; ")})` : ""}`
        : undefined,
  },
);
