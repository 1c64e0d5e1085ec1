import { createLogger } from "@warren/platform/log";
import { runMain } from "@warren/platform/main";
import { loadApiConfig } from "../api/config.js";
import { ApiServer } from "../api/server.js";
import { loadMasterConfig } from "../master/config.js";
import { connectNodeAgents } from "../master/connect-node-agent-client.js";
import { Master } from "../master/server.js";

const masterLog = createLogger("master");
const apiLog = createLogger("api");

/**
 * The api and the master in one process: what a single control-plane host runs (`warren up`'s default). The api
 * calls the master in-process instead of over loopback HTTP — two hops fewer on every create and kill — while the
 * master still listens on its own port for anything else that calls it. Each reads its usual variables; several
 * hosts run them as separate processes (`api/main.ts`, `master/main.ts`), as the Helm chart does.
 */
runMain(
  async () => {
    const master = await Master.start({
      config: loadMasterConfig(process.env, (message) => masterLog.warn(message)),
      nodeAgent: connectNodeAgents(),
      log: masterLog,
    });
    try {
      const api = await ApiServer.start({
        config: loadApiConfig(process.env, (message) => apiLog.warn(message)),
        log: apiLog,
        masterTransport: master.inProcessTransport(),
      });
      return {
        // The api first: it drains its requests, which may still need the master.
        stop: async () => {
          try {
            await api.stop();
          } finally {
            await master.stop();
          }
        },
      };
    } catch (error) {
      await master.stop().catch(() => undefined);
      throw error;
    }
  },
  { name: "warren-api-master", log: apiLog },
);
