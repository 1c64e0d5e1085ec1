import { loadMasterConfig } from "./config.js";
import { connectNodeAgents } from "./connect-node-agent-client.js";
import { createLogger } from "./log.js";
import { Master } from "./server.js";

const log = createLogger("master");
const config = loadMasterConfig();
const master = await Master.start({ config, nodeAgent: connectNodeAgents(), log });

let stopping = false;
for (const signal of ["SIGTERM", "SIGINT"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    log.info("stopping", { signal });
    master.stop().then(
      () => process.exit(0),
      (error) => {
        log.error("stop failed", { error });
        process.exit(1);
      },
    );
  });
}
