#!/usr/bin/env node
import { runMain } from "@warren/platform/main";
import { loadConfig, USAGE } from "./config.js";
import { createLogger } from "./log.js";
import { startGateway } from "./server.js";

const log = createLogger("code-gateway");

runMain(
  async () => {
    const config = loadConfig(process.argv.slice(2), process.env);
    // The token came in through the environment; kernels the gateway starts must not inherit it.
    delete process.env.CODE_GATEWAY_ACCESS_TOKEN;
    delete process.env.ENVD_ACCESS_TOKEN;
    const gateway = await startGateway(config, log);
    return { stop: () => gateway.close() };
  },
  { name: "warren-code-gateway", log, usage: USAGE },
);
