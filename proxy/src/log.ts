/**
 * Structured logs: one JSON object per line on stderr. Callers pass ids (sandbox, request, port);
 * nothing here ever receives a header value, and fields named like secrets are dropped as a
 * second line of defence.
 */
export type LogFields = Record<string, unknown>;

const SECRET_FIELD = /token|secret|password|authorization|cookie|signature/i;

export interface Logger {
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
}

export function createLogger(
  component: string,
  write: (line: string) => void = (line) => process.stderr.write(line),
): Logger {
  const emit = (level: string, msg: string, fields: LogFields = {}) => {
    const safe: LogFields = {};
    for (const [key, value] of Object.entries(fields)) if (!SECRET_FIELD.test(key)) safe[key] = value;
    write(`${JSON.stringify({ time: new Date().toISOString(), level, component, pid: process.pid, msg, ...safe })}\n`);
  };
  return {
    info: (msg, fields) => emit("info", msg, fields),
    warn: (msg, fields) => emit("warn", msg, fields),
    error: (msg, fields) => emit("error", msg, fields),
  };
}

export const silentLogger: Logger = { info() {}, warn() {}, error() {} };
