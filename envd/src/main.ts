#!/usr/bin/env node
import { runMain } from "@warren/platform/main";
import { loadConfig, USAGE } from "./config.js";
import { createLogger } from "./log.js";
import { startEnvd } from "./server.js";

const log = createLogger("envd");

runMain(
  async () => {
    const config = loadConfig(process.argv.slice(2), process.env);
    // The token came in through the environment; processes envd starts must not inherit it (nor the spawner's
    // descriptors, which are envd's own).
    delete process.env.ENVD_ACCESS_TOKEN;
    delete process.env.WARREN_SPAWNER;
    const envd = await startEnvd(config, log);
    return { stop: () => envd.close() };
  },
  { name: "warren-envd", log, usage: USAGE },
);
