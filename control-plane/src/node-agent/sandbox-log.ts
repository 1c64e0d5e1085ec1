/**
 * The sandbox's own log as the logs API serves it: envd writes JSON lines (`{time, level, component, msg, ...}`,
 * envd/src/log.ts); anything else PID 1 or envd print (tini, a crash trace) is kept as an `info` line stamped with
 * the time of the previous JSON line (the file has no other clock). Field values become strings; nested values
 * are JSON.
 */
export interface SandboxLogLine {
  readonly timestampMs: number;
  readonly level: "debug" | "info" | "warn" | "error";
  readonly message: string;
  readonly fields: Readonly<Record<string, string>>;
}

const LEVELS = new Set(["debug", "info", "warn", "error"]);

export function parseSandboxLog(text: string, limit: number, fallbackTimeMs: number): SandboxLogLine[] {
  const lines: SandboxLogLine[] = [];
  let lastTime = 0;
  for (const raw of text.split("\n")) {
    const line = raw.trimEnd();
    if (line === "") continue;
    let parsed: Record<string, unknown> | undefined;
    if (line.startsWith("{")) {
      try {
        const value: unknown = JSON.parse(line);
        if (value && typeof value === "object" && !Array.isArray(value)) parsed = value as Record<string, unknown>;
      } catch {
        parsed = undefined;
      }
    }
    const time = parsed ? Date.parse(String(parsed.time)) : Number.NaN;
    if (parsed && Number.isFinite(time)) {
      lastTime = time;
      const { time: _time, level, msg, ...rest } = parsed;
      const fields: Record<string, string> = {};
      for (const [key, value] of Object.entries(rest)) {
        fields[key] = typeof value === "string" ? value : JSON.stringify(value);
      }
      lines.push({
        timestampMs: time,
        level: LEVELS.has(String(level)) ? (level as SandboxLogLine["level"]) : "info",
        message: typeof msg === "string" ? msg : JSON.stringify(msg ?? ""),
        fields,
      });
    } else {
      lines.push({ timestampMs: lastTime || fallbackTimeMs, level: "info", message: line, fields: {} });
    }
  }
  return lines.slice(-limit);
}
