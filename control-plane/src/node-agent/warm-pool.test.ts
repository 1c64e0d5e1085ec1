import { describe, expect, it } from "vitest";
import type { Instance } from "../runtime/driver.js";
import { silentLogger } from "./log.js";
import { StartGate } from "./start-gate.js";
import { RefillHold, WarmPool, WarmPoolClosed, type WarmPoolOptions } from "./warm-pool.js";

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

/**
 * A pool over fake starts that take `startMs` (or `startMsOf(start)`), counting how many run at once and recording
 * each start's class; `clock.now` is the demand's clock, `fail` makes the next starts fail, `discardMs` slows removals.
 */
function fakePool(
  options: Partial<WarmPoolOptions> & {
    startMs?: number;
    startMsOf?: (n: number) => number;
    fail?: { next: number };
    /** How long removing a sandbox takes; counted once done. */
    discardMs?: number;
  } = {},
) {
  const clock = { now: 0 };
  const counts = { started: 0, discarded: 0, active: 0, peak: 0, begun: 0 };
  const starts: { n: number; background: boolean; instanceId: string }[] = [];
  const pool = new WarmPool(
    "base",
    {
      sizing: { floor: 2, ceiling: 8, windowMs: 60_000 },
      refillConcurrency: 2,
      now: () => clock.now,
      ...options,
    },
    async (start) => {
      const n = counts.begun++;
      const instance = fakeInstance();
      starts.push({ n, background: start.background, instanceId: instance.instanceId });
      start.onInstance(instance.instanceId);
      counts.active++;
      counts.peak = Math.max(counts.peak, counts.active);
      await new Promise((r) => setTimeout(r, options.startMsOf?.(n) ?? options.startMs ?? 5));
      counts.active--;
      if (options.fail && options.fail.next > 0) {
        options.fail.next--;
        throw new Error("envd did not answer");
      }
      counts.started++;
      return instance;
    },
    async () => {
      if (options.discardMs) await new Promise((r) => setTimeout(r, options.discardMs));
      counts.discarded++;
    },
    silentLogger,
  );
  return { pool, clock, counts, starts };
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

  it("delays a claim's refill while the pool holds more than a quarter of its target (each claim pushes it back), not below", async () => {
    const { pool, counts, clock } = fakePool({
      sizing: { floor: 8, ceiling: 8, windowMs: 60_000 },
      refillConcurrency: 8,
      refillDelayMs: 500,
      startMs: 1,
    });
    await pool.filled();
    const before = counts.started;
    // A run of claims 50 ms apart: each pushes the refill back, so none starts while it lasts.
    for (let i = 0; i < 4; i++) {
      clock.now += 50;
      expect(pool.take()).toBeDefined();
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(counts.started).toBe(before);
    // 500 ms without a claim: the pool refills to its target.
    await new Promise((r) => setTimeout(r, 700));
    expect(counts.started).toBe(before + 4);
    await pool.filled();

    // Down to a quarter of its target (2 of 8): the refill starts at once.
    const filled = counts.started;
    for (let i = 0; i < 6; i++) pool.take();
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

  it("an empty pool serves a create the first start to finish: a refill under way, made foreground for it", async () => {
    const promoted: string[] = [];
    // The floor's two refills (the second quicker than the first), then slow ones beside them.
    const { pool, starts, counts } = fakePool({
      startMsOf: (n) => (n === 0 ? 200 : n === 1 ? 60 : 400),
      promote: async (instanceId) => {
        promoted.push(instanceId);
      },
    });
    pool.refill();
    await new Promise((r) => setTimeout(r, 20));
    expect(pool.take()).toBeUndefined();
    const t0 = performance.now();
    const instance = await pool.next();
    expect(performance.now() - t0).toBeLessThan(150);
    // Starts under way were enough: none begun in the foreground for the create; the oldest refill was promoted,
    // and the pool went on refilling beside it.
    expect(starts.every((s) => s.background)).toBe(true);
    expect(promoted).toEqual([starts[0]?.instanceId]);
    expect(instance.instanceId).toBe(starts[1]?.instanceId);
    expect(starts.length).toBeGreaterThan(2);
    expect(pool.waitingCount).toBe(0);
    await pool.filled();
    expect(counts.discarded).toBe(0);
    await pool.close();
  });

  it("with no start under way, begins one per waiting create on a create's slot, serving them in arrival order", async () => {
    const forCreate: number[] = [];
    const { pool, starts } = fakePool({
      sizing: { floor: 0, ceiling: 0, windowMs: 60_000 },
      startMsOf: (n) => 60 - n * 20,
      scheduleForCreate: async (start) => {
        forCreate.push(starts.length);
        return start();
      },
    });
    const served: string[] = [];
    const waiting = ["first", "second", "third"].map((name) =>
      pool.next().then((i) => served.push(`${name} ${i.instanceId}`)),
    );
    expect(pool.waitingCount).toBe(3);
    await Promise.all(waiting);
    expect(forCreate).toHaveLength(3);
    expect(starts.every((s) => !s.background)).toBe(true);
    // The last start finished first: it went to the first create.
    expect(served).toEqual([
      `first ${starts[2]?.instanceId}`,
      `second ${starts[1]?.instanceId}`,
      `third ${starts[0]?.instanceId}`,
    ]);
    await pool.close();
  });

  it("a create that gives up leaves the queue: its start goes to the pool, or never begins if it had no slot yet", async () => {
    const { pool, counts } = fakePool({ sizing: { floor: 0, ceiling: 0, windowMs: 60_000 }, startMs: 40 });
    const abort = new AbortController();
    const waiting = pool.next(abort.signal);
    abort.abort(new Error("caller gave up"));
    await expect(waiting).rejects.toThrow("caller gave up");
    expect(pool.waitingCount).toBe(0);
    await new Promise((r) => setTimeout(r, 80));
    expect(pool.readyCount).toBe(1);
    expect(counts.discarded).toBe(0);
    await pool.trim(); // above its target of 0
    expect(counts.discarded).toBe(1);

    // Its start still waits for a slot (the gate's queue, here 30 ms) when the create gives up: it never begins.
    const { pool: queued, counts: queuedCounts } = fakePool({
      sizing: { floor: 0, ceiling: 0, windowMs: 60_000 },
      scheduleForCreate: async (start) => {
        await new Promise((r) => setTimeout(r, 30));
        return start();
      },
    });
    const gaveUp = new AbortController();
    const left = queued.next(gaveUp.signal);
    gaveUp.abort(new Error("caller gave up"));
    await expect(left).rejects.toThrow("caller gave up");
    await new Promise((r) => setTimeout(r, 60));
    expect(queuedCounts.begun).toBe(0);
    expect(queued.readyCount).toBe(0);
    await Promise.all([pool.close(), queued.close()]);
  });

  it("a create gets the error of the start begun for it; closing fails the creates that wait", async () => {
    const { pool } = fakePool({ sizing: { floor: 0, ceiling: 0, windowMs: 60_000 }, startMs: 10, fail: { next: 1 } });
    await expect(pool.next()).rejects.toThrow("envd did not answer");
    expect(pool.waitingCount).toBe(0);

    // The start the create waited for ends after the close: its sandbox is removed before close() resolves.
    const { pool: slow, counts } = fakePool({
      sizing: { floor: 1, ceiling: 1, windowMs: 60_000 },
      startMs: 200,
      discardMs: 50,
    });
    const waiting = expect(slow.next()).rejects.toBeInstanceOf(WarmPoolClosed);
    await slow.close();
    await waiting;
    expect(counts.begun).toBeGreaterThan(0);
    expect(counts.discarded).toBe(counts.started);
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

  it("gives back ready sandboxes on request, and refills none while a RefillHold is held, then refills", async () => {
    const hold = new RefillHold();
    const { pool, counts } = fakePool({ hold });
    await pool.filled();
    expect(pool.readyCount).toBe(2);
    await hold.during(async () => {
      expect(await pool.release(1)).toBe(1);
      pool.refill();
      await new Promise((r) => setTimeout(r, 30));
      expect(counts.discarded).toBe(1);
      expect(pool.readyCount).toBe(1);
      expect(counts.begun).toBe(2);
    });
    // The hold's end resumes the refill by itself (nothing here calls refill).
    await new Promise((r) => setTimeout(r, 30));
    expect(counts.begun).toBe(3);
    expect(pool.readyCount).toBe(2);
    await pool.close();
  });
});
