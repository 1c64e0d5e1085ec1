import { mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger } from "@warren/platform/log";
import { afterAll, describe, expect, it } from "vitest";
import { capLogFile, LogCap } from "./log-cap.js";

const dir = mkdtempSync(join(tmpdir(), "warren-log-cap-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const numbered = (from: number, count: number) =>
  Array.from({ length: count }, (_, i) => `line ${String(from + i).padStart(6, "0")} ${"x".repeat(90)}\n`).join("");

describe("sandbox log cap", () => {
  it("cuts a file past the cap to whole lines of its end, says so first, and an O_APPEND writer goes on at the new end", async () => {
    const path = join(dir, "envd.log");
    // The sandbox's side: a descriptor opened for appending before the cut, as PID 1's stdout is.
    const writer = openSync(path, "a");
    writeSync(writer, numbered(0, 3000)); // ~300 KB
    const dropped = await capLogFile(path, { maxBytes: 100_000, keepBytes: 50_000 });
    expect(dropped).toBeGreaterThan(250_000);
    writeSync(writer, "written after the cut\n");
    const text = readFileSync(path, "utf8");
    expect(text.length).toBeLessThan(51_000);
    expect(text).not.toContain("\0"); // no hole where the old end was
    const lines = text.trimEnd().split("\n");
    const notice = JSON.parse(lines[0]!);
    expect(notice).toMatchObject({ level: "warn", component: "warren" });
    expect(notice.msg).toContain(`${dropped} bytes dropped`);
    expect(lines[1]).toMatch(/^line \d{6} x{90}$/); // whole lines only
    expect(lines.at(-2)).toBe(`line 002999 ${"x".repeat(90)}`);
    expect(lines.at(-1)).toBe("written after the cut");
  });

  it("leaves a file within the cap, and a missing one, alone", async () => {
    const path = join(dir, "small.log");
    writeFileSync(path, numbered(0, 10));
    expect(await capLogFile(path, { maxBytes: 100_000, keepBytes: 50_000 })).toBe(0);
    expect(readFileSync(path, "utf8")).toBe(numbered(0, 10));
    expect(await capLogFile(join(dir, "missing.log"), { maxBytes: 1, keepBytes: 1 })).toBe(0);
  });

  it("a sweep caps every file the driver names and skips ones that vanished", async () => {
    const a = join(dir, "a.log");
    const b = join(dir, "b.log");
    writeFileSync(a, numbered(0, 2000));
    writeFileSync(b, numbered(0, 5));
    const cap = new LogCap(() => [a, join(dir, "gone.log"), b], { maxBytes: 20_000, keepBytes: 10_000 }, silentLogger);
    await cap.sweep();
    expect(statSync(a).size).toBeLessThan(11_000);
    expect(readFileSync(b, "utf8")).toBe(numbered(0, 5));
  });
});
