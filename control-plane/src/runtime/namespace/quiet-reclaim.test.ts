import { describe, expect, it } from "vitest";
import { QuietReclaim } from "./quiet-reclaim.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function recorder(options: { quietMs: number; maxDelayMs: number }) {
  const ran: { item: string; at: number }[] = [];
  const t0 = performance.now();
  const reclaim = new QuietReclaim<string>(options, async (item) => {
    ran.push({ item, at: performance.now() - t0 });
  });
  return { reclaim, ran };
}

describe("quiet reclaim", () => {
  it("runs what waits once the node has been quiet for quietMs, in order", async () => {
    const { reclaim, ran } = recorder({ quietMs: 300, maxDelayMs: 5000 });
    reclaim.add("a");
    reclaim.add("b");
    await sleep(20);
    expect(ran).toEqual([]);
    expect(reclaim.pending).toBe(2);
    await sleep(600);
    expect(ran.map((r) => r.item)).toEqual(["a", "b"]);
    expect(reclaim.pending).toBe(0);
  });

  it("activity pushes it back, but never past maxDelayMs after the oldest", async () => {
    const { reclaim, ran } = recorder({ quietMs: 400, maxDelayMs: 800 });
    reclaim.add("a");
    // Busy every 30 ms for 1.2 s: never quiet for 400 ms.
    for (let i = 0; i < 40; i++) {
      await sleep(30);
      reclaim.activity();
    }
    expect(ran.map((r) => r.item)).toEqual(["a"]);
    expect(ran[0]?.at).toBeGreaterThanOrEqual(790);
    expect(ran[0]?.at).toBeLessThan(1200);
  });

  it("runs one item at a time, whether its timer or settled() started the run", async () => {
    let active = 0;
    let peak = 0;
    const ran: number[] = [];
    const reclaim = new QuietReclaim<number>({ quietMs: 10, maxDelayMs: 20 }, async (item) => {
      peak = Math.max(peak, ++active);
      await sleep(15);
      active--;
      ran.push(item);
    });
    const settling: Promise<void>[] = [];
    for (let i = 0; i < 6; i++) {
      reclaim.add(i);
      await sleep(8);
      if (i % 2 === 0) settling.push(reclaim.settled());
    }
    await Promise.all(settling);
    await reclaim.settled();
    expect(ran).toEqual([0, 1, 2, 3, 4, 5]);
    expect(peak).toBe(1);
  });

  it("settled() runs what waits at once; a failing item does not stop the others", async () => {
    const ran: string[] = [];
    const reclaim = new QuietReclaim<string>({ quietMs: 10_000, maxDelayMs: 60_000 }, async (item) => {
      if (item === "bad") throw new Error("umount failed");
      ran.push(item);
    });
    reclaim.add("a");
    reclaim.add("bad");
    reclaim.add("c");
    await reclaim.settled();
    expect(ran).toEqual(["a", "c"]);
    expect(reclaim.pending).toBe(0);
    await reclaim.settled();
  });
});
