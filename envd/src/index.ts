export { fileSignature } from "./auth.js";
export { type EnvdConfig, loadConfig } from "./config.js";
export { type RunningEnvd, startEnvd } from "./server.js";
export { ENVD_VERSION } from "./version.js";
