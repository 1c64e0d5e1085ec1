import { open, stat } from "node:fs/promises";
import type { Logger } from "@warren/platform/log";

/**
 * A sandbox's log file on the node (the namespace driver's envd.log, PID 1's stdout/stderr; the microVM's
 * console.log, its serial console) is written by the sandbox itself: its root can write to PID 1's stdout or to
 * the console as fast as it likes, and the file lives on the node's disk, outside the sandbox's disk quota. So
 * the drivers keep each one under a cap: past `maxBytes` the file is cut down to its last `keepBytes` (whole
 * lines) in place, and a line saying so starts it.
 *
 * In place, because the writers hold the file open with O_APPEND (PID 1 since its start, or CRIU's restore;
 * QEMU's `logappend=on`): their next write lands at the new end. What is written during the cut itself is lost.
 */
export interface LogCapLimits {
  /** A file larger than this is cut. */
  readonly maxBytes: number;
  /** What of its end a cut file keeps. */
  readonly keepBytes: number;
}

/** A cap of `maxBytes` keeping the last half (WARREN_SANDBOX_LOG_MAX_BYTES). */
export function sandboxLogCap(maxBytes: number): LogCapLimits {
  return { maxBytes, keepBytes: Math.floor(maxBytes / 2) };
}

/** 8 MiB per sandbox; the logs API reads at most 4 MiB of the end (agent.ts). */
export const DEFAULT_LOG_CAP: LogCapLimits = sandboxLogCap(8 << 20);

/** How often the files are looked at: what a sandbox can write beyond the cap is its write rate times this. */
const SWEEP_INTERVAL_MS = 1000;

/**
 * Cuts `path` to its last `keepBytes` (from the first line start in them) when it is larger than `maxBytes`.
 * Resolves with the bytes dropped (0: left alone or missing).
 */
export async function capLogFile(path: string, limits: LogCapLimits): Promise<number> {
  const size = await stat(path).then(
    (st) => st.size,
    () => 0,
  );
  if (size <= limits.maxBytes) return 0;
  const file = await open(path, "r+");
  try {
    const keep = Buffer.alloc(Math.min(limits.keepBytes, size));
    const { bytesRead } = await file.read(keep, 0, keep.length, size - keep.length);
    const tail = keep.subarray(0, bytesRead);
    const lineStart = tail.indexOf(0x0a) + 1;
    const kept = tail.subarray(lineStart > 0 ? lineStart : 0);
    const dropped = size - kept.length;
    const notice = Buffer.from(
      `${JSON.stringify({
        time: new Date().toISOString(),
        level: "warn",
        component: "warren",
        msg: `log cut to its last ${kept.length} bytes: ${dropped} bytes dropped (cap ${limits.maxBytes} bytes)`,
      })}\n`,
    );
    await file.write(notice, 0, notice.length, 0);
    await file.write(kept, 0, kept.length, notice.length);
    await file.truncate(notice.length + kept.length);
    return dropped;
  } finally {
    await file.close();
  }
}

/** Sweeps the files a driver names every second, capping each (started by the driver's start(), ended by close()). */
export class LogCap {
  private timer: NodeJS.Timeout | undefined;
  private sweeping = false;

  constructor(
    private readonly paths: () => Iterable<string>,
    private readonly limits: LogCapLimits,
    private readonly log: Logger,
  ) {}

  start(): void {
    this.timer ??= setInterval(() => void this.sweep(), SWEEP_INTERVAL_MS);
    this.timer.unref();
  }

  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One pass over every file (tests call it directly). */
  async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      for (const path of this.paths()) {
        const dropped = await capLogFile(path, this.limits).catch((error: Error) => {
          this.log.warn("capping a sandbox log failed", { path, error: error.message });
          return 0;
        });
        if (dropped > 0) this.log.info("sandbox log cut", { path, droppedBytes: dropped });
      }
    } finally {
      this.sweeping = false;
    }
  }
}
