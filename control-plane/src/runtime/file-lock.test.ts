import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tryFileLock, withFileLock } from "./file-lock.js";

describe("template build lock", () => {
  it("runs jobs holding the same lock one at a time, and releases it after a failure", async () => {
    const path = join(mkdtempSync(join(tmpdir(), "lock-")), "t.lock");
    const events: string[] = [];
    const job = (name: string) => async () => {
      events.push(`${name} start`);
      await new Promise((resolve) => setTimeout(resolve, 50));
      events.push(`${name} end`);
    };
    await expect(withFileLock(path, async () => Promise.reject(new Error("boom")))).rejects.toThrow("boom");
    await Promise.all([withFileLock(path, job("a")), withFileLock(path, job("b"))]);
    expect(events.length).toBe(4);
    expect(events[1]).toBe(`${events[0]!.split(" ")[0]} end`);
  });
});

describe("tryFileLock", () => {
  it("takes a free lock, refuses a held one without waiting, and takes it again once released", async () => {
    const path = join(mkdtempSync(join(tmpdir(), "lock-")), "t.lock");
    const first = await tryFileLock(path);
    expect(first).toBeDefined();
    expect(await tryFileLock(path)).toBeUndefined();
    // Waiting: taken once the holder lets go.
    const waiting = tryFileLock(path, 5_000);
    await new Promise((resolve) => setTimeout(resolve, 200));
    await first?.release();
    const taken = await waiting;
    expect(taken).toBeDefined();
    await taken?.release();
    const again = await tryFileLock(path);
    expect(again).toBeDefined();
    await again?.release();
  });
});
