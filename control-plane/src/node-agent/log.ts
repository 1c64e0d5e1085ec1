/** The node agent logs with Warren's one structured logger (`@warren/platform/log`). */
export { createLogger, type LogFields, type Logger, type LogLevel, silentLogger } from "@warren/platform/log";

/** Figures in log fields (milliseconds, MiB) to one decimal. */
export function tenths(value: number): number {
  return Math.round(value * 10) / 10;
}
