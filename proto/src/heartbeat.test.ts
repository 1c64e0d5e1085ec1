import { describe, expect, it } from "vitest";
import { heartbeatFromHash, heartbeatToHash, type NodeHeartbeat } from "./heartbeat.js";

const beat: NodeHeartbeat = {
  nodeId: "node-a",
  addr: "10.0.0.5:5008",
  driver: "namespace",
  cpuCount: 8,
  memoryTotalBytes: 34_359_738_368,
  memoryFreeBytes: 17_179_869_184,
  sandboxes: 3,
  pools: { base: 2, "code-interpreter-v1": 1 },
  templates: ["base", "code-interpreter-v1"],
  servable: ["base", "code-interpreter-v1", "scratch"],
  templatesWanted: ["code-interpreter-v1"],
  updatedAt: 1_764_650_000_000,
};

describe("node heartbeat hash", () => {
  it("decodes what the node agent encodes, field for field", () => {
    expect(heartbeatFromHash("node-a", heartbeatToHash(beat))).toEqual(beat);
  });

  it("writes numbers as decimal text and lists and maps as JSON", () => {
    expect(heartbeatToHash(beat)).toEqual({
      nodeId: "node-a",
      addr: "10.0.0.5:5008",
      driver: "namespace",
      cpuCount: "8",
      memoryTotalBytes: "34359738368",
      memoryFreeBytes: "17179869184",
      sandboxes: "3",
      pools: '{"base":2,"code-interpreter-v1":1}',
      templates: '["base","code-interpreter-v1"]',
      servable: '["base","code-interpreter-v1","scratch"]',
      templatesWanted: '["code-interpreter-v1"]',
      updatedAt: "1764650000000",
    });
  });

  it("leaves `servable` and `templatesWanted` out when an agent does not send them, and reads them back absent", () => {
    const { servable: _servable, templatesWanted: _wanted, ...older } = beat;
    const hash = heartbeatToHash(older);
    expect(hash).not.toHaveProperty("servable");
    expect(hash).not.toHaveProperty("templatesWanted");
    expect(heartbeatFromHash("node-a", hash)).not.toHaveProperty("servable");
    expect(heartbeatFromHash("node-a", hash)).not.toHaveProperty("templatesWanted");
  });

  it("is no heartbeat without an address (an expired or half-written key)", () => {
    expect(heartbeatFromHash("node-a", {})).toBeUndefined();
    expect(heartbeatFromHash("node-a", { nodeId: "node-a", cpuCount: "4" })).toBeUndefined();
  });

  it("reads older agents' comma-separated templates and takes the key's node id when the hash has none", () => {
    const decoded = heartbeatFromHash("node-b", { addr: "10.0.0.6:5008", templates: "base,code-interpreter-v1" });
    expect(decoded?.nodeId).toBe("node-b");
    expect(decoded?.templates).toEqual(["base", "code-interpreter-v1"]);
    expect(decoded?.pools).toEqual({});
  });

  it("turns malformed numbers into 0 and malformed JSON into empty values instead of dropping the node", () => {
    const decoded = heartbeatFromHash("node-a", {
      addr: "10.0.0.5:5008",
      cpuCount: "many",
      pools: "{not json",
      templates: "[broken",
    });
    expect(decoded).toMatchObject({ cpuCount: 0, pools: {}, templates: [] });
  });
});
