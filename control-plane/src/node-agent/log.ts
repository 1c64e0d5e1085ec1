/** One JSON object per line on stderr. Fields whose name looks like a secret are dropped, never printed. */
export type LogLevel = "debug" | "info" | "warn" | "error";
export type LogFields = Readonly<Record<string, unknown>>;

export interface Logger {
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
  child(fields: LogFields): Logger;
}

const SECRET_FIELD = /token|secret|password|authorization|cookie|apikey|api_key/i;
const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export function createLogger(
  component: string,
  options: { level?: LogLevel; write?: (line: string) => void; base?: LogFields } = {},
): Logger {
  const min = ORDER[options.level ?? "info"];
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const base = options.base ?? {};
  const emit = (level: LogLevel, msg: string, fields?: LogFields) => {
    if (ORDER[level] < min) return;
    const record: Record<string, unknown> = { time: new Date().toISOString(), level, component, msg };
    for (const source of [base, fields ?? {}]) {
      for (const [key, value] of Object.entries(source)) {
        if (SECRET_FIELD.test(key) || value === undefined) continue;
        record[key] = value instanceof Error ? value.message : value;
      }
    }
    write(`${JSON.stringify(record)}\n`);
  };
  return {
    debug: (msg, fields) => emit("debug", msg, fields),
    info: (msg, fields) => emit("info", msg, fields),
    warn: (msg, fields) => emit("warn", msg, fields),
    error: (msg, fields) => emit("error", msg, fields),
    child: (fields) => createLogger(component, { ...options, base: { ...base, ...fields } }),
  };
}

/** A logger that prints nothing (tests and benchmarks that do not want the noise). */
export const silentLogger: Logger = createLogger("silent", { write: () => undefined });

/** Figures in log fields (milliseconds, MiB) to one decimal. */
export function tenths(value: number): number {
  return Math.round(value * 10) / 10;
}
