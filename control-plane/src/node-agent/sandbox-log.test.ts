import { describe, expect, it } from "vitest";
import { parseSandboxLog } from "./sandbox-log.js";

describe("sandbox log lines", () => {
  it("parses envd's JSON lines, keeps other lines, and returns the newest `limit`", () => {
    const text = [
      '{"time":"2026-11-30T10:00:00.000Z","level":"info","component":"envd","msg":"listening","port":49983}',
      "tini: something plain",
      '{"time":"2026-11-30T10:00:01.500Z","level":"error","component":"envd","msg":"process failed","pid":12,"args":["a"]}',
      '{"time":"not a time","msg":"odd"}',
      "",
    ].join("\n");
    const lines = parseSandboxLog(text, 10, 42);
    expect(lines).toEqual([
      {
        timestampMs: Date.parse("2026-11-30T10:00:00.000Z"),
        level: "info",
        message: "listening",
        fields: { component: "envd", port: "49983" },
      },
      {
        timestampMs: Date.parse("2026-11-30T10:00:00.000Z"),
        level: "info",
        message: "tini: something plain",
        fields: {},
      },
      {
        timestampMs: Date.parse("2026-11-30T10:00:01.500Z"),
        level: "error",
        message: "process failed",
        fields: { component: "envd", pid: "12", args: '["a"]' },
      },
      {
        timestampMs: Date.parse("2026-11-30T10:00:01.500Z"),
        level: "info",
        message: '{"time":"not a time","msg":"odd"}',
        fields: {},
      },
    ]);
    expect(parseSandboxLog(text, 2, 42).map((l) => l.message)).toEqual([
      "process failed",
      '{"time":"not a time","msg":"odd"}',
    ]);
    expect(parseSandboxLog("plain first\n", 5, 42)[0]?.timestampMs).toBe(42);
  });
});
