import { describe, expect, it } from "vitest";
import type { Instance } from "../runtime/driver.js";
import { silentLogger } from "./log.js";
import { StartGate } from "./start-gate.js";
import { WarmPool, type WarmPoolOptions } from "./warm-pool.js";

let seq = 0;
const fakeInstance = (): Instance => ({
  instanceId: `i${seq++}`,
  templateId: "base",
  templateHash: "h",
  addr: "10.0.0.2",
  envdUrl: "http://10.0.0.2:49983",
  resources: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 100 },
  createdAt: 0,
  labels: {},
  paused: false,
  checkpointed: false,
  stopped: false,
});

/** A pool over fake starts that take `startMs`, counting how many run at once; `clock.now` is the demand's clock. */
function fakePool(options: Partial<WarmPoolOptions> & { startMs?: number } = {}) {
  const clock = { now: 0 };
  const counts = { started: 0, discarded: 0, active: 0, peak: 0 };
  const pool = new WarmPool(
    "base",
    {
      sizing: { floor: 2, ceiling: 8, windowMs: 60_000 },
      refillConcurrency: 2,
      now: () => clock.now,
      ...options,
    },
    async () => {
      counts.active++;
      counts.peak = Math.max(counts.peak, counts.active);
      await new Promise((r) => setTimeout(r, options.startMs ?? 5));
      counts.active--;
      counts.started++;
      return fakeInstance();
    },
    async () => {
      counts.discarded++;
    },
    silentLogger,
  );
  return { pool, clock, counts };
}

describe("warm pool", () => {
  it("fills to its floor with no demand", async () => {
    const { pool, counts } = fakePool();
    expect(pool.target).toBe(2);
    await pool.filled();
    expect(pool.readyCount).toBe(2);
    expect(counts.started).toBe(2);
    await pool.close();
  });

  it("delays a claim's refill while a ready sandbox is left (one timer for a burst), not when the pool is empty", async () => {
    const { pool, counts } = fakePool({ refillDelayMs: 100, startMs: 1 });
    await pool.filled();
    const before = counts.started;
    expect(pool.take()).toBeDefined(); // one left: the refill waits
    await new Promise((r) => setTimeout(r, 40));
    expect(counts.started).toBe(before);
    await new Promise((r) => setTimeout(r, 120));
    expect(counts.started).toBeGreaterThan(before);
    await pool.filled();

    const filled = counts.started;
    pool.take();
    pool.take(); // the pool is empty now: the refill starts at once
    await new Promise((r) => setTimeout(r, 20));
    expect(counts.started).toBeGreaterThan(filled);
    await pool.close();
  });

  it("grows with claims up to the ceiling, refilling while claims go on, at most refillConcurrency at once", async () => {
    const { pool, clock, counts } = fakePool();
    await pool.filled();
    let served = 0;
    for (let i = 0; i < 12; i++) {
      clock.now += 100;
      if (pool.take()) served++;
    }
    expect(served).toBe(2);
    expect(pool.target).toBe(8);
    await pool.filled();
    expect(pool.readyCount).toBe(8);
    expect(counts.peak).toBe(2);
    // The next burst of the same size is served from the pool.
    let next = 0;
    for (let i = 0; i < 8; i++) if (pool.take()) next++;
    expect(next).toBe(8);
    await pool.close();
  });

  it("gives back what is above its target once the demand fades, never below the floor", async () => {
    const { pool, clock, counts } = fakePool();
    for (let i = 0; i < 6; i++) {
      clock.now += 100;
      pool.take();
    }
    await pool.filled();
    expect(pool.readyCount).toBe(6);
    clock.now += 60_000; // one window: 6 / e ≈ 2.2 claims left in the window
    await pool.trim();
    expect(pool.readyCount).toBe(2);
    expect(counts.discarded).toBe(4);
    clock.now += 600_000;
    await pool.trim();
    expect(pool.readyCount).toBe(2);
    await pool.close();
    expect(counts.discarded).toBe(6);
  });

  it("takeReady serves a ready sandbox without counting demand", async () => {
    const { pool } = fakePool({ sizing: { floor: 1, ceiling: 8, windowMs: 60_000 } });
    await pool.filled();
    expect(pool.takeReady()).toBeDefined();
    expect(pool.takeReady()).toBeUndefined();
    expect(pool.target).toBe(1);
    await pool.close();
  });

  it("refills through the start gate as background starts, after the creates that wait", async () => {
    const gate = new StartGate(1, 1);
    const order: string[] = [];
    const { pool } = fakePool({
      sizing: { floor: 1, ceiling: 1, windowMs: 60_000 },
      schedule: (start) =>
        gate.runBackground(async () => {
          order.push("refill");
          return start();
        }),
    });
    // A create holds the only slot and another waits: the pool's first refill waits behind both.
    const first = gate.run(async () => {
      order.push("create 1");
      await new Promise((r) => setTimeout(r, 20));
    });
    pool.refill();
    const second = gate.run(async () => {
      order.push("create 2");
    });
    await Promise.all([first, second]);
    await pool.filled();
    expect(order).toEqual(["create 1", "create 2", "refill"]);
    await pool.close();
  });
});
