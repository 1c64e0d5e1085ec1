import { runMain } from "@warren/platform/main";
import { loadMasterConfig } from "./config.js";
import { connectNodeAgents } from "./connect-node-agent-client.js";
import { createLogger } from "./log.js";
import { Master } from "./server.js";

const log = createLogger("master");

runMain(
  async () => {
    const config = loadMasterConfig(process.env, (message) => log.warn(message));
    const master = await Master.start({ config, nodeAgent: connectNodeAgents(), log });
    return { stop: () => master.stop() };
  },
  { name: "warren-master", log },
);
