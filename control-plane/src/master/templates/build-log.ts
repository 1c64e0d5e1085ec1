import type { Db } from "../../store/db.js";
import { appendBuildLogs, type BuildLogEntry } from "../../store/templates.js";

/** Longest line kept (a step printing megabytes on one line must not become one huge row). */
const MAX_LINE = 4096;

export interface CommandOutput {
  write(stream: "stdout" | "stderr", chunk: Uint8Array): void;
  end(): void;
}
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

  /** The log of a build another run already wrote to (a takeover): it goes on after the last line. */
  static async continuing(db: Db, buildId: string): Promise<BuildLog> {
    const log = new BuildLog(db, buildId);
    const result = await db.query<{ next: number }>(
      "SELECT coalesce(max(seq) + 1, 0)::int AS next FROM template_build_logs WHERE build_id = $1",
      [buildId],
    );
    log.seq = result.rows[0]?.next ?? 0;
    return log;
  }

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

  /**
   * One command's output, split into lines (`[prefix] [stdout]: line`) across chunks; `end` logs a last line
   * that had no newline.
   */
  output(prefix: string, step: string): CommandOutput {
    const streams = {
      stdout: { rest: "", decoder: new TextDecoder() },
      stderr: { rest: "", decoder: new TextDecoder() },
    };
    return {
      write: (stream, chunk) => {
        const s = streams[stream];
        const lines = (s.rest + s.decoder.decode(chunk, { stream: true })).split(/\r?\n/);
        s.rest = lines.pop() ?? "";
        for (const line of lines) this.add("info", `[${prefix}] [${stream}]: ${line}`, step);
        if (s.rest.length > MAX_LINE) {
          this.add("info", `[${prefix}] [${stream}]: ${s.rest}`, step);
          s.rest = "";
        }
      },
      end: () => {
        for (const stream of ["stdout", "stderr"] as const) {
          const s = streams[stream];
          const last = s.rest + s.decoder.decode();
          if (last !== "") this.add("info", `[${prefix}] [${stream}]: ${last}`, step);
          s.rest = "";
        }
      },
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
