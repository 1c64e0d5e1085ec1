import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../log.js";
import { AwakeClock, LeaseBook, type LeasedProcess } from "./leases.js";

/** A process that records the signals it gets and exits when `exit()` is called. */
function fakeProcess(pid: number): LeasedProcess & { signals: string[]; exit(): void } {
  let exit: () => void = () => undefined;
  const exited = new Promise<void>((resolve) => {
    exit = resolve;
  });
  const proc = {
    pid,
    tag: undefined,
    running: true,
    signals: [] as string[],
    signal(signal: NodeJS.Signals) {
      proc.signals.push(signal);
    },
    whenExited: () => exited,
    exit() {
      proc.running = false;
      exit();
    },
  };
  return proc;
}

describe("LeaseBook", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("keeps no timer while it holds no lease, ticks while one runs and stops once the last one's process exits", async () => {
    const book = new LeaseBook(1_000, silentLogger, new AwakeClock(() => performance.now()));
    expect(vi.getTimerCount()).toBe(0);

    const proc = fakeProcess(42);
    book.add(proc, 500);
    expect(vi.getTimerCount()).toBe(1);
    await vi.advanceTimersByTimeAsync(400);
    expect(proc.signals).toEqual([]);
    await vi.advanceTimersByTimeAsync(200);
    expect(proc.signals).toEqual(["SIGTERM"]);
    await vi.advanceTimersByTimeAsync(1_100);
    expect(proc.signals).toEqual(["SIGTERM", "SIGKILL"]);

    proc.exit();
    await vi.advanceTimersByTimeAsync(200);
    expect(vi.getTimerCount()).toBe(0);
    expect(book.list()).toEqual([]);
  });

  it("a lease added after a quiet spell gets its whole time: the spell is not counted against it", async () => {
    const book = new LeaseBook(1_000, silentLogger, new AwakeClock(() => performance.now()));
    const first = fakeProcess(1);
    book.add(first, 200);
    first.exit();
    await vi.advanceTimersByTimeAsync(60_000);
    expect(vi.getTimerCount()).toBe(0);

    const second = fakeProcess(2);
    book.add(second, 1_000);
    await vi.advanceTimersByTimeAsync(800);
    expect(second.signals).toEqual([]);
    expect(book.list()[0]?.remainingMs).toBeGreaterThan(0);
    await vi.advanceTimersByTimeAsync(400);
    expect(second.signals).toEqual(["SIGTERM"]);
    book.close();
  });
});
