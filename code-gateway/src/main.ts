#!/usr/bin/env node
import { ConfigError, loadConfig } from "./config.js";
import { createLogger } from "./log.js";
import { startGateway } from "./server.js";

const log = createLogger("code-gateway");

async function main(): Promise<void> {
  const config = loadConfig(process.argv.slice(2), process.env);
  // The token came in through the environment; kernels the gateway starts must not inherit it.
  delete process.env.CODE_GATEWAY_ACCESS_TOKEN;
  delete process.env.ENVD_ACCESS_TOKEN;
  const gateway = await startGateway(config, log);
  const shutdown = (signal: string) => {
    log.info("shutting down", { signal });
    gateway.close().then(
      () => process.exit(0),
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
  if (error instanceof ConfigError) {
    process.stderr.write(`${error.message}\n`);
    process.exit(2);
  }
  log.error("code gateway failed to start", { error: error instanceof Error ? error.message : String(error) });
  process.exit(1);
});
