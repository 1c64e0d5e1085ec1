import { createLogger } from "../master/log.js";
import { loadApiConfig } from "./config.js";
import { ApiServer } from "./server.js";

const log = createLogger("api");
const api = await ApiServer.start({ config: loadApiConfig(), log });

let stopping = false;
for (const signal of ["SIGTERM", "SIGINT"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    log.info("stopping", { signal });
    api.stop().then(
      () => process.exit(0),
      (error) => {
        log.error("stop failed", { error });
        process.exit(1);
      },
    );
  });
}
