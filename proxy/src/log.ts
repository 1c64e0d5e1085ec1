/**
 * The proxy logs with Warren's one structured logger (`@warren/platform/log`). Callers pass ids (sandbox, request,
 * port), never a header value; every line carries the process id, since several workers may share one stream.
 */
import { createLogger as createPlatformLogger, type Logger, type LoggerOptions } from "@warren/platform/log";

export { type LogFields, type Logger, silentLogger } from "@warren/platform/log";

export function createLogger(component: string, options: LoggerOptions = {}): Logger {
  return createPlatformLogger(component, { ...options, base: { pid: process.pid, ...options.base } });
}
