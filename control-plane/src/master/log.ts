/** JSON-lines logs on stderr. Fields whose names look secret are dropped, never printed. */
export type LogFields = Record<string, unknown>;

const SECRET = /token|secret|password|authorization|api[-_]?key|envvars/i;

export interface Logger {
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
  child(fields: LogFields): Logger;
}

export function createLogger(
  component: string,
  base: LogFields = {},
  sink: { write(line: string): unknown } = process.stderr,
): Logger {
  const write = (level: string, msg: string, fields: LogFields = {}) => {
    const entry: LogFields = { time: new Date().toISOString(), level, component, msg };
    for (const [key, value] of Object.entries({ ...base, ...fields })) {
      if (!SECRET.test(key)) entry[key] = value instanceof Error ? value.message : value;
    }
    sink.write(`${JSON.stringify(entry)}\n`);
  };
  return {
    info: (msg, fields) => write("info", msg, fields),
    warn: (msg, fields) => write("warn", msg, fields),
    error: (msg, fields) => write("error", msg, fields),
    child: (fields) => createLogger(component, { ...base, ...fields }, sink),
  };
}

/** A logger that drops everything (tests). */
export const silentLogger: Logger = {
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
  child: () => silentLogger,
};
