import { describe, expect, it } from "vitest";
import { BackgroundTicket, StartGate, StartQueueFull } from "./start-gate.js";

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

  it("runs background starts only on slots no create waits for, at most backgroundLimit at once", async () => {
    const gate = new StartGate(3, 1);
    const order: string[] = [];
    let backgroundActive = 0;
    let backgroundPeak = 0;
    const job = (name: string, background: boolean, ms: number) =>
      (background ? gate.runBackground.bind(gate) : gate.run.bind(gate))(async () => {
        order.push(name);
        if (background) backgroundPeak = Math.max(backgroundPeak, ++backgroundActive);
        await new Promise((r) => setTimeout(r, ms));
        if (background) backgroundActive--;
      });
    const jobs = [
      job("refill a", true, 30),
      job("refill b", true, 5),
      job("create 1", false, 20),
      job("create 2", false, 20),
      job("create 3", false, 5),
      job("refill c", true, 5),
    ];
    await Promise.all(jobs);
    // refill a starts at once; refill b waits (one background at a time); creates 1 and 2 take the free slots,
    // create 3 waits for one and goes before refills b and c, which wait until no create does.
    expect(order.slice(0, 3)).toEqual(["refill a", "create 1", "create 2"]);
    expect(order.indexOf("create 3")).toBeLessThan(order.indexOf("refill b"));
    expect(order.indexOf("create 3")).toBeLessThan(order.indexOf("refill c"));
    expect(backgroundPeak).toBe(1);
  });

  it("refuses a create past maxQueued waiting creates, and queues again once the queue drains", async () => {
    const gate = new StartGate(1, 1, 2);
    let release!: () => void;
    const held = gate.run(
      () =>
        new Promise<void>((r) => {
          release = r;
        }),
    );
    const waiting = [gate.run(async () => 1), gate.run(async () => 2)];
    await expect(gate.run(async () => 3)).rejects.toBeInstanceOf(StartQueueFull);
    expect(gate.queued).toBe(2);
    release();
    await held;
    expect(await Promise.all(waiting)).toEqual([1, 2]);
    expect(await gate.run(async () => 4)).toBe(4);
  });

  it("a create whose caller gave up leaves the queue and never starts", async () => {
    const gate = new StartGate(1);
    let release!: () => void;
    const held = gate.run(
      () =>
        new Promise<void>((r) => {
          release = r;
        }),
    );
    const abort = new AbortController();
    let started = false;
    const abandoned = gate.run(async () => {
      started = true;
    }, abort.signal);
    const next = gate.run(async () => "next");
    expect(gate.queued).toBe(2);
    abort.abort(new Error("deadline passed"));
    await expect(abandoned).rejects.toThrow(/deadline passed/);
    expect(gate.queued).toBe(1);
    release();
    await held;
    expect(await next).toBe("next");
    expect(started).toBe(false);
  });

  it("a promoted refill stops counting as one: running, another refill begins; waiting, it goes with the creates", async () => {
    const gate = new StartGate(2, 1);
    const order: string[] = [];
    const hold = (name: string) => {
      let release = () => {};
      const held = new Promise<void>((r) => {
        release = r;
      });
      return {
        release: () => release(),
        run: async () => {
          order.push(name);
          await held;
        },
      };
    };
    // Running: one refill holds the only background slot; promoted, it lets the second refill begin.
    const first = hold("refill 1");
    const second = hold("refill 2");
    const ticket = new BackgroundTicket();
    const running = gate.runBackground(first.run, ticket);
    const waiting = gate.runBackground(second.run);
    await new Promise((r) => setTimeout(r, 5));
    expect(order).toEqual(["refill 1"]);
    ticket.promote();
    await new Promise((r) => setTimeout(r, 5));
    expect(order).toEqual(["refill 1", "refill 2"]);
    first.release();
    second.release();
    await Promise.all([running, waiting]);

    // Waiting: both slots busy, a create and a refill queued; the promoted refill goes among the creates, in
    // arrival order (before a create that came after it), and a refill queued behind creates stays behind.
    order.length = 0;
    const busy = [hold("busy 1"), hold("busy 2")];
    const busyRuns = busy.map((b) => gate.run(b.run));
    const queuedTicket = new BackgroundTicket();
    const promotedRefill = gate.runBackground(async () => {
      order.push("promoted refill");
    }, queuedTicket);
    const plainRefill = gate.runBackground(async () => {
      order.push("plain refill");
    });
    const create = gate.run(async () => {
      order.push("create");
    });
    queuedTicket.promote();
    expect(gate.queued).toBe(2);
    busy[0]?.release();
    busy[1]?.release();
    await Promise.all([...busyRuns, create, plainRefill, promotedRefill]);
    expect(order.slice(2)).toEqual(["promoted refill", "create", "plain refill"]);
  });

  it("refuses a limit below one", () => {
    expect(() => new StartGate(0)).toThrow(/positive integer/);
  });
});
