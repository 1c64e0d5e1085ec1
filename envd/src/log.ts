/** envd logs with Warren's one structured logger (`@warren/platform/log`): ids, never tokens. */
export { createLogger, type LogFields, type Logger, silentLogger } from "@warren/platform/log";
