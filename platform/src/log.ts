/**
 * Structured logs for every Warren process: one JSON object per line on stderr.
 *
 * Callers pass ids (sandbox, request, node, pid), never secrets. Fields whose name looks like a secret are
 * dropped as a second line of defence, by one list for every component, so a field that one component drops is
 * never printed by another.
 */
export type LogLevel = "debug" | "info" | "warn" | "error";
export type LogFields = Readonly<Record<string, unknown>>;

export interface Logger {
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
  /** A logger that adds `fields` to every line (a sandbox id, a request id). */
  child(fields: LogFields): Logger;
}

export interface LoggerOptions {
  /** Lines below this level are not written (default `info`). */
  readonly level?: LogLevel;
  /** Where lines go (default stderr); tests collect them. */
  readonly write?: (line: string) => void;
  /** Fields on every line. */
  readonly base?: LogFields;
}

/**
 * Names of fields never printed: access tokens, API keys, passwords, cookies, signatures, credentials, and
 * `envVars` (their values are the user's and may be secrets).
 */
export const SECRET_FIELD = /token|secret|passw(or)?d|authorization|cookie|signature|credential|api[-_]?key|envvars/i;

export const LOG_LEVELS: readonly LogLevel[] = ["debug", "info", "warn", "error"];
const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export function isLogLevel(text: string): text is LogLevel {
  return (LOG_LEVELS as readonly string[]).includes(text);
}

export function createLogger(component: string, options: LoggerOptions = {}): Logger {
  const min = ORDER[options.level ?? "info"];
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const base = options.base ?? {};
  const emit = (level: LogLevel, msg: string, fields?: LogFields) => {
    if (ORDER[level] < min) return;
    const record: Record<string, unknown> = { time: new Date().toISOString(), level, component, msg };
    for (const source of [base, fields ?? {}]) {
      for (const [key, value] of Object.entries(source)) {
        if (value === undefined || SECRET_FIELD.test(key)) continue;
        record[key] = loggable(value);
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

/** An `Error` serialises to `{}` in JSON: print its message instead. Everything else is printed as given. */
function loggable(value: unknown): unknown {
  return value instanceof Error ? value.message : value;
}
