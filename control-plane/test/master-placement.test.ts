import type { NodeHeartbeat } from "@warren/proto/redis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RecentPlacements, rankNodes } from "../src/master/placement.js";
import { TestEnv } from "./api-harness.js";

const GiB = 1024 ** 3;
function node(nodeId: string, fields: Partial<NodeHeartbeat> = {}): NodeHeartbeat {
  return {
    nodeId,
    addr: `${nodeId}:1`,
    driver: "fake",
    cpuCount: 4,
    memoryTotalBytes: 4 * GiB,
    memoryFreeBytes: 4 * GiB,
    sandboxes: 0,
    pools: {},
    templates: [],
    updatedAt: 0,
    ...fields,
  };
}

describe("placement ranking", () => {
  const opts = { memoryOvercommit: 1 };
  const req = { templateId: "base", memoryMB: 512 };

  it("spreads a burst over warm pools: placements since a node's heartbeat count against its pool", () => {
    const beat = Date.now() - 1_000;
    const nodes = [
      node("a", { templates: ["base"], pools: { base: 2 }, updatedAt: beat }),
      node("b", { templates: ["base"], pools: { base: 2 }, updatedAt: beat }),
    ];
    const recent = new RecentPlacements();
    const chosen: string[] = [];
    for (let i = 0; i < 4; i++) {
      const first = rankNodes(nodes, new Map(), req, opts, recent)[0] as NodeHeartbeat;
      recent.record(first.nodeId, "base");
      chosen.push(first.nodeId);
    }
    expect(chosen.sort()).toEqual(["a", "a", "b", "b"]);
    // A placement from before a node's heartbeat is already in that heartbeat's pool count.
    const old = new RecentPlacements();
    old.record("a", "base", beat - 10);
    old.record("b", "base", beat + 10);
    expect(rankNodes(nodes, new Map(), req, opts, old)[0]?.nodeId).toBe("a");
  });

  it("prefers a warm pool over a cached template over neither", () => {
    const ranked = rankNodes(
      [
        node("plain"),
        node("cached", { templates: ["base"] }),
        node("warm", { templates: ["base"], pools: { base: 2 } }),
      ],
      new Map(),
      req,
      opts,
    );
    expect(ranked.map((n) => n.nodeId)).toEqual(["warm", "cached", "plain"]);
  });

  it("excludes nodes whose reserved memory leaves no room and ranks ties by free memory", () => {
    const reserved = new Map([
      ["full", 4096 - 100],
      ["busy", 2048],
    ]);
    const ranked = rankNodes([node("full"), node("busy"), node("idle")], reserved, req, opts);
    expect(ranked.map((n) => n.nodeId)).toEqual(["idle", "busy"]);
  });

  it("skips nodes that say their driver cannot run the template; nodes that say nothing serve every template", () => {
    const nodes = [
      node("namespace-node", { servable: ["base"], pools: { "base-vm": 3 } }),
      node("vm-node", { servable: ["base", "base-vm"] }),
      node("old-agent"),
    ];
    const ranked = rankNodes(nodes, new Map(), { templateId: "base-vm", memoryMB: 512 }, opts);
    expect(ranked.map((n) => n.nodeId).sort()).toEqual(["old-agent", "vm-node"]);
    expect(rankNodes(nodes, new Map(), req, opts)).toHaveLength(3);
  });

  it("an empty warm pool does not count as warm", () => {
    const ranked = rankNodes(
      [node("a", { pools: { base: 0 } }), node("b", { templates: ["base"] })],
      new Map(),
      req,
      opts,
    );
    expect(ranked[0]?.nodeId).toBe("b");
  });
});

describe("placement through the master", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    ({ apiKey } = await env.team("placement"));
  });
  afterAll(() => env.stop());

  const create = () => env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
  const nodeOf = async (id: string) =>
    (await env.db.query<{ node_id: string }>("SELECT node_id FROM sandboxes WHERE id = $1", [id])).rows[0]?.node_id;

  it("answers 503 with an E2B error body when no node is heartbeating, leaving no running row", async () => {
    const res = await create();
    expect(res.status).toBe(503);
    expect(res.body).toMatchObject({ code: 503, error_code: "sandbox_capacity_unavailable" });
    const live = await env.db.query("SELECT 1 FROM sandboxes WHERE state IN ('starting', 'running')");
    expect(live.rowCount).toBe(0);
  });

  it("places on the node with the warm pool, and retries on another node when that one refuses", async () => {
    const warm = await env.addNode("warm", { pools: { base: 1 }, templates: ["base"] });
    await env.addNode("cold", { templates: [] });
    const first = (await create()).body as { sandboxID: string };
    expect(await nodeOf(first.sandboxID)).toBe("warm");
    warm.refuse = true;
    const second = await create();
    expect(second.status).toBe(201);
    expect(await nodeOf((second.body as { sandboxID: string }).sandboxID)).toBe("cold");
    warm.refuse = false;
  });

  it("respects capacity: a node full of reserved memory is skipped; all full ⇒ 503 and the row failed", async () => {
    // 1 GiB nodes hold two 512 MB base sandboxes each.
    await env.stopHeartbeat("warm");
    await env.stopHeartbeat("cold");
    await env.addNode("small-1", { memoryTotalBytes: 1024 ** 3 });
    await env.addNode("small-2", { memoryTotalBytes: 1024 ** 3 });
    const placed: string[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await create();
      expect(res.status).toBe(201);
      placed.push((await nodeOf((res.body as { sandboxID: string }).sandboxID)) ?? "");
    }
    expect(placed.sort()).toEqual(["small-1", "small-1", "small-2", "small-2"]);
    const full = await create();
    expect(full.status).toBe(503);
    const failed = await env.db.query("SELECT end_reason FROM sandboxes WHERE state = 'failed'");
    expect(failed.rows.map((r) => r.end_reason)).toContain("placement_failed");
  });

  it("a template that requires a driver no live node has: 503 naming the drivers, no row; placed where one has it", async () => {
    for (const id of ["small-1", "small-2", "warm", "cold"]) await env.stopHeartbeat(id);
    await env.addNode("ns-only", { driver: "namespace", servable: ["base", "code-interpreter-v1"] });
    const refused = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base-vm" } });
    expect(refused.status).toBe(503);
    expect((refused.body as { message: string }).message).toContain(
      "no live node can run template 'base-vm': it requires a runtime driver none of them has (namespace)",
    );
    const rows = await env.db.query("SELECT 1 FROM sandboxes WHERE template_id = 'base-vm'");
    expect(rows.rowCount).toBe(0);
    await env.addNode("vm-node", { driver: "microvm", servable: ["base", "base-vm"] });
    const placed = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base-vm" } });
    expect(placed.status).toBe(201);
    expect(await nodeOf((placed.body as { sandboxID: string }).sandboxID)).toBe("vm-node");
  });
});
