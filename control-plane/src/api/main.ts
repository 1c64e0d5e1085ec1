import { createLogger } from "@warren/platform/log";
import { runMain } from "@warren/platform/main";
import { loadApiConfig } from "./config.js";
import { ApiServer } from "./server.js";

const log = createLogger("api");

runMain(
  async () => {
    const api = await ApiServer.start({ config: loadApiConfig(process.env, (message) => log.warn(message)), log });
    return { stop: () => api.stop() };
  },
  { name: "warren-api", log },
);
