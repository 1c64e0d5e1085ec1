import { describe, expect, it } from "vitest";
import { DemandRate, type PoolSizing, poolTarget } from "./pool-sizing.js";

const sizing: PoolSizing = { floor: 2, ceiling: 16, windowMs: 60_000 };

describe("pool sizing", () => {
  it("keeps the floor with no demand", () => {
    const demand = new DemandRate(sizing.windowMs);
    expect(demand.perSecond(1_000_000)).toBe(0);
    expect(poolTarget(demand.perSecond(1_000_000), sizing)).toBe(2);
  });

  it("holds about as many sandboxes as were claimed over the last window", () => {
    const demand = new DemandRate(sizing.windowMs);
    // Ten claims 100 ms apart: the decayed count is just under ten.
    for (let i = 0; i < 10; i++) demand.record(i * 100);
    const count = demand.perSecond(900) * 60;
    expect(count).toBeGreaterThan(9.9);
    expect(count).toBeLessThan(10);
    expect(poolTarget(demand.perSecond(900), sizing)).toBe(10);
  });

  it("never goes above the ceiling however high the demand", () => {
    const demand = new DemandRate(sizing.windowMs);
    for (let i = 0; i < 100; i++) demand.record(i * 10);
    expect(poolTarget(demand.perSecond(1000), sizing)).toBe(16);
  });

  it("shrinks back to the floor as the demand fades", () => {
    const demand = new DemandRate(sizing.windowMs);
    for (let i = 0; i < 12; i++) demand.record(i * 100);
    const at = (ms: number) => poolTarget(demand.perSecond(1100 + ms), sizing);
    expect(at(0)).toBe(12);
    // One window later the count has decayed by e: 12 / e ≈ 4.4.
    expect(at(60_000)).toBe(4);
    expect(at(180_000)).toBe(2);
  });

  it("a single claim long ago keeps nothing above a zero floor", () => {
    const demand = new DemandRate(sizing.windowMs);
    demand.record(0);
    const zeroFloor = { ...sizing, floor: 0 };
    expect(poolTarget(demand.perSecond(0), zeroFloor)).toBe(1);
    expect(poolTarget(demand.perSecond(120_000), zeroFloor)).toBe(0);
  });

  it("a ceiling below the floor is the floor (a fixed pool)", () => {
    const demand = new DemandRate(1000);
    for (let i = 0; i < 50; i++) demand.record(i);
    expect(poolTarget(demand.perSecond(50), { floor: 3, ceiling: 0, windowMs: 1000 })).toBe(3);
  });

  it("refuses a window that is not positive", () => {
    expect(() => new DemandRate(0)).toThrow(/positive/);
  });
});
