export { ConfigError, type GatewayConfig, loadConfig } from "./config.js";
export { type ContextInfo, ContextRegistry } from "./contexts.js";
export { createLogger, type Logger, silentLogger } from "./log.js";
export { type Gateway, startGateway } from "./server.js";
