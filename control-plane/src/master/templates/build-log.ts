import type { Db } from "../../store/db.js";
import { appendBuildLogs, type BuildLogEntry } from "../../store/templates.js";

/** Longest line kept (a step printing megabytes on one line must not become one huge row). */
const MAX_LINE = 4096;
const FLUSH_MS = 200;

/**
 * A build's log, appended to PostgreSQL in order (the status endpoint serves it by offset while the build runs).
 * Entries are batched and written at most every 200 ms; `flush` waits for everything written so far.
 */
export class BuildLog {
  private seq = 0;
  private pending: BuildLogEntry[] = [];
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> = Promise.resolve();
  private failed: unknown;

  constructor(
    private readonly db: Db,
    private readonly buildId: string,
  ) {}

  add(level: BuildLogEntry["level"], message: string, step?: string): void {
    const text = message.length > MAX_LINE ? `${message.slice(0, MAX_LINE)}…` : message;
    this.pending.push({ timestamp: new Date(), level, message: text, ...(step ? { step } : {}) });
    this.timer ??= setTimeout(() => {
      this.timer = undefined;
      void this.write();
    }, FLUSH_MS);
  }

  info(message: string, step?: string): void {
    this.add("info", message, step);
  }

  /** A stream of command output, split into lines: `[prefix] [stdout]: line`. */
  output(prefix: string, stream: "stdout" | "stderr", step: string): (chunk: Uint8Array) => void {
    let rest = "";
    const decoder = new TextDecoder();
    return (chunk) => {
      const text = rest + decoder.decode(chunk, { stream: true });
      const lines = text.split(/\r?\n/);
      rest = lines.pop() ?? "";
      for (const line of lines) this.add("info", `[${prefix}] [${stream}]: ${line}`, step);
      if (rest.length > MAX_LINE) {
        this.add("info", `[${prefix}] [${stream}]: ${rest}`, step);
        rest = "";
      }
    };
  }

  private write(): Promise<void> {
    const batch = this.pending;
    this.pending = [];
    if (batch.length === 0) return this.writing;
    const first = this.seq;
    this.seq += batch.length;
    this.writing = this.writing
      .then(() => appendBuildLogs(this.db, this.buildId, first, batch))
      .catch((error) => {
        this.failed = error;
      });
    return this.writing;
  }

  async flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    await this.write();
    if (this.failed) throw this.failed;
  }
}
