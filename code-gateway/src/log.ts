/**
 * Structured logs: one JSON object per line on stderr. Callers pass ids (context, request,
 * kernel pid); nothing here ever receives a token, and fields named like secrets are dropped
 * as a second line of defence.
 */
export type LogFields = Record<string, unknown>;

const SECRET_FIELD = /token|secret|password|authorization|signature|key/i;

export interface Logger {
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
}

export function createLogger(
  component: string,
  write: (line: string) => void = (l) => process.stderr.write(l),
): Logger {
  const emit = (level: string, msg: string, fields: LogFields = {}) => {
    const safe: LogFields = {};
    for (const [name, value] of Object.entries(fields)) if (!SECRET_FIELD.test(name)) safe[name] = value;
    write(`${JSON.stringify({ time: new Date().toISOString(), level, component, msg, ...safe })}\n`);
  };
  return {
    info: (msg, fields) => emit("info", msg, fields),
    warn: (msg, fields) => emit("warn", msg, fields),
    error: (msg, fields) => emit("error", msg, fields),
  };
}

export const silentLogger: Logger = { info() {}, warn() {}, error() {} };
