/** The api and the master log with Warren's one structured logger (`@warren/platform/log`). */
export { createLogger, type LogFields, type Logger, silentLogger } from "@warren/platform/log";
