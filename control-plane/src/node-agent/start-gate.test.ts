import { describe, expect, it } from "vitest";
import { StartGate } from "./start-gate.js";

describe("start gate", () => {
  it("runs at most `limit` starts at once, the rest in arrival order, and frees slots on failure", async () => {
    const gate = new StartGate(2);
    let active = 0;
    let peak = 0;
    const order: number[] = [];
    const job = (i: number) =>
      gate.run(async () => {
        active++;
        peak = Math.max(peak, active);
        await new Promise((r) => setTimeout(r, 10));
        active--;
        order.push(i);
        if (i === 1) throw new Error("start failed");
        return i;
      });
    const results = await Promise.allSettled([0, 1, 2, 3, 4, 5].map(job));
    expect(peak).toBe(2);
    expect(order.slice(2)).toEqual([2, 3, 4, 5]);
    expect(results.filter((r) => r.status === "rejected")).toHaveLength(1);
    expect(gate.queued).toBe(0);
    expect(await gate.run(async () => "free again")).toBe("free again");
  });

  it("refuses a limit below one", () => {
    expect(() => new StartGate(0)).toThrow(/positive integer/);
  });
});
