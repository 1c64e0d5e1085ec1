import { silentLogger } from "@warren/platform/log";
import { describe, expect, it } from "vitest";
import { NetworkPool } from "./network.js";

describe("sandbox network addressing", () => {
  it("gives each slot its own /30: host side .1, sandbox .2, with names tagged by the agent instance", () => {
    const pool = new NetworkPool({ instance: "x1", cidr: "10.201.0.0/16", poolSize: 0, log: silentLogger });
    expect(pool.slot(0)).toEqual({
      index: 0,
      netns: "warren-x1-0",
      netnsPath: "/run/netns/warren-x1-0",
      hostVeth: "wr-x1-0",
      hostAddr: "10.201.0.1",
      sandboxAddr: "10.201.0.2",
    });
    expect(pool.slot(64)).toMatchObject({ hostAddr: "10.201.1.1", sandboxAddr: "10.201.1.2" });
    expect(pool.slot(16383).hostVeth.length).toBeLessThanOrEqual(15);
    expect(pool.inputChain).toBe("WARREN-X1-IN");
  });

  it("refuses malformed ranges and tags", () => {
    expect(() => new NetworkPool({ instance: "x", cidr: "10.0.0.0/33", poolSize: 0, log: silentLogger })).toThrow(
      /CIDR/,
    );
    expect(() => new NetworkPool({ instance: "BAD!", cidr: "10.0.0.0/16", poolSize: 0, log: silentLogger })).toThrow(
      /instance/,
    );
  });
});
