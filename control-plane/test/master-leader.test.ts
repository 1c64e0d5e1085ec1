import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Master } from "../src/master/server.js";
import { eventually, TestEnv } from "./api-harness.js";

/** Two master replicas on one database: one leads (advisory lock); the standby takes over the timers. */
describe("leader election", () => {
  const env = new TestEnv();
  let first: Master;
  let second: Master;
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    first = env.masters[0] as Master;
    second = await env.startMaster();
    await env.addNode("node-a");
    ({ apiKey } = await env.team("leader"));
  });
  afterAll(() => env.stop());

  it("elects exactly one leader among two replicas", async () => {
    await eventually(async () => (first.isLeader || second.isLeader ? true : undefined), "a leader");
    expect([first.isLeader, second.isLeader].filter(Boolean)).toHaveLength(1);
    expect(first.isLeader).toBe(true);
  });

  it("reports leadership, sandboxes by state and RPCs as Prometheus metrics", async () => {
    await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    const leaderText = await (await fetch(`${first.url}/metrics`)).text();
    const standbyText = await (await fetch(`${second.url}/metrics`)).text();
    expect(leaderText).toMatch(/^warren_master_leader 1$/m);
    expect(standbyText).toMatch(/^warren_master_leader 0$/m);
    expect(leaderText).toMatch(/^warren_sandboxes\{state="running"\} 1$/m);
    expect(leaderText).toContain('warren_master_rpcs_total{method="CreateSandbox",code="ok"} 1');
  });

  it("a standby serves requests too: transitions are serialized in PostgreSQL, not by the leader", async () => {
    const res = await second.lifecycle.create({
      teamId: (await env.db.query("SELECT id FROM teams LIMIT 1")).rows[0].id,
      templateId: "base",
      timeoutSeconds: 60,
      metadata: {},
      envVars: {},
      autoPause: false,
      autoPauseMemory: true,
      autoResume: false,
      network: null,
      allowInternetAccess: null,
      volumeMounts: [],
    });
    expect(res.sandbox.sandboxId).toMatch(/^[a-z0-9]+$/);
    await second.lifecycle.kill(res.sandbox.sandboxId, undefined);
  });

  it("when the leader stops, the standby takes over and evicts a sandbox whose timer was set under the old leader", async () => {
    const { sandboxID } = (
      await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", timeout: 2 } })
    ).body as { sandboxID: string };
    await first.stop();
    env.masters.splice(env.masters.indexOf(first), 1);
    await eventually(async () => (second.isLeader ? true : undefined), "standby elected");
    await eventually(
      async () =>
        (await env.db.query("SELECT 1 FROM sandboxes WHERE id = $1 AND state = 'killed'", [sandboxID])).rowCount
          ? true
          : undefined,
      "eviction by the new leader",
    );
    expect(env.nodes.get("node-a")?.sandboxes.has(sandboxID)).toBe(false);
  });
});
