/** Severity of a build log line (E2B's levels). */
export type LogEntryLevel = "debug" | "info" | "warn" | "error";

// chalk/ansi-regex, as E2B strips it: OSC/DCS/SOS/PM/APC strings, then CSI sequences.
const ANSI = new RegExp(
  "(?:\\u001B[\\]PX^_][\\s\\S]*?(?:\\u0007|\\u001B\\u005C|\\u009C))|" +
    "[\\u001B\\u009B][[\\]()#;?]*(?:\\d{1,4}(?:[;:]\\d{0,4})*)?[\\dA-PR-TZcf-nq-uy=><~]",
  "g",
);

export function stripAnsi(text: string): string {
  return text.replace(ANSI, "");
}

/** One line of a template build's log; the message has its ANSI escapes removed. */
export class LogEntry {
  readonly message: string;
  /** Warren extra: the build phase the line belongs to (`base`, `1`…`N`, `finalize`), when the server says. */
  step?: string;

  constructor(
    readonly timestamp: Date,
    readonly level: LogEntryLevel,
    message: string,
  ) {
    this.message = stripAnsi(message);
  }

  toString(): string {
    return `[${this.timestamp.toISOString()}] [${this.level}] ${this.message}`;
  }
}

/** Emitted to `onBuildLogs` once when `Template.build` starts. */
export class LogEntryStart extends LogEntry {
  constructor(timestamp: Date, message: string) {
    super(timestamp, "debug", message);
  }
}

/** Emitted to `onBuildLogs` once when `Template.build` ends, whether it succeeded or not. */
export class LogEntryEnd extends LogEntry {
  constructor(timestamp: Date, message: string) {
    super(timestamp, "debug", message);
  }
}
