import { NODES_SET_KEY, nodeKey, routeEventsChannel, routeKey, routeToHash } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually, REDIS_URL, TestEnv } from "./api-harness.js";

/** Reconciliation between PostgreSQL and what nodes report (the master is leader with 100 ms loops). */
describe("reconciliation", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    ({ apiKey } = await env.team("reconcile"));
  });
  afterAll(() => env.stop());

  const create = async () =>
    (
      (await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } })).body as {
        sandboxID: string;
      }
    ).sandboxID;
  const row = async (id: string) =>
    (
      await env.db.query<{ state: string; end_reason: string | null; exec_id: string }>(
        "SELECT state, end_reason, exec_id FROM sandboxes WHERE id = $1",
        [id],
      )
    ).rows[0];
  const writeRoute = async (id: string, exec: string, node: string) => {
    await env.redis.hset(
      routeKey(id),
      routeToHash({
        sandboxId: id,
        exec,
        generation: 1,
        node,
        nodeAddr: "127.0.0.1:1",
        sandboxAddr: "10.0.0.2",
        ports: {},
        state: "running",
        team: "t",
        public: true,
        trafficTokenHash: "",
        autoResume: false,
        maskRequestHost: "",
      }),
    );
  };

  it("marks a sandbox the node no longer has as lost, removes its route and publishes the deletion", async () => {
    const node = await env.addNode("node-r1");
    const id = await create();
    const exec = (await row(id))?.exec_id ?? "";
    await writeRoute(id, exec, "node-r1");
    const subscriber = new Redis(REDIS_URL);
    const messages: string[] = [];
    await subscriber.subscribe(routeEventsChannel(env.redisPrefix));
    subscriber.on("message", (_channel, message: string) => messages.push(message));
    node.sandboxes.delete(id);
    await eventually(async () => ((await row(id))?.state === "failed" ? true : undefined), "lost sandbox");
    expect((await row(id))?.end_reason).toBe("missing_on_node");
    expect(await env.redis.exists(routeKey(id))).toBe(0);
    await eventually(
      async () => (messages.some((m) => m.includes(id) && m.includes('"deleted"')) ? true : undefined),
      "route event",
    );
    subscriber.disconnect();
    const events = await env.request("GET", `/warren/v1/sandboxes/${id}/events`, { apiKey });
    const last = (events.body as { events: { type: string; data: { reason: string } }[] }).events.at(-1);
    expect(last).toMatchObject({ type: "sandbox.lost", data: { reason: "missing_on_node" } });
    const info = await env.request("GET", `/sandboxes/${id}`, { apiKey });
    expect(info.status).toBe(404);
  });

  it("marks a node that stops heartbeating down and reports each of its sandboxes as lost", async () => {
    await env.addNode("node-r2");
    await env.stopHeartbeat("node-r1");
    const ids = [await create(), await create()];
    await eventually(
      async () =>
        (await env.db.query("SELECT 1 FROM nodes WHERE id = 'node-r2' AND state = 'up'")).rowCount ? true : undefined,
      "node up",
    );
    await env.stopHeartbeat("node-r2");
    await eventually(
      async () =>
        (await env.db.query("SELECT 1 FROM nodes WHERE id = 'node-r2' AND state = 'down'")).rowCount ? true : undefined,
      "node down",
    );
    for (const id of ids) {
      await eventually(async () => ((await row(id))?.state === "failed" ? true : undefined), "sandbox lost");
      expect((await row(id))?.end_reason).toBe("node_down");
    }
    const feed = await env.request("GET", "/warren/v1/events?limit=1000", { apiKey });
    const lost = (feed.body as { events: { sandboxID: string; type: string; data: { node: string } }[] }).events.filter(
      (e) => e.type === "sandbox.lost" && e.data.node === "node-r2",
    );
    expect(lost.map((e) => e.sandboxID).sort()).toEqual([...ids].sort());
  });

  it("kills a sandbox a node runs that PostgreSQL has as killed (orphan)", async () => {
    const node = await env.addNode("node-r3");
    const id = await create();
    await env.db.query("UPDATE sandboxes SET state = 'killed' WHERE id = $1", [id]);
    await eventually(async () => (node.killed.includes(id) ? true : undefined), "orphan kill");
    expect(node.sandboxes.has(id)).toBe(false);
  });

  it("fails a sandbox stuck in starting past the start timeout, then removes it from its node", async () => {
    await env.addNode("node-r4");
    const id = await create();
    const placedOn = (await env.db.query("SELECT node_id FROM sandboxes WHERE id = $1", [id])).rows[0].node_id;
    const node = env.nodes.get(placedOn);
    if (!node) throw new Error(`no fake node ${placedOn}`);
    await env.db.query(
      "UPDATE sandboxes SET state = 'starting', created_at = now() - interval '1 hour' WHERE id = $1",
      [id],
    );
    await eventually(async () => ((await row(id))?.state === "failed" ? true : undefined), "stuck start failed");
    expect((await row(id))?.end_reason).toBe("start_timeout");
    await eventually(async () => (node.killed.includes(id) ? true : undefined), "orphan removed");
  });

  it("never kills a sandbox it has no record of (another cluster's or a node agent's own)", async () => {
    const node = await env.addNode("node-r5");
    await node.create({
      sandboxId: "foreign-sandbox",
      teamId: "elsewhere",
      templateId: "base",
      resources: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024 },
      envVars: {},
      envdAccessToken: "x",
      trafficTokenHash: "",
      publicTraffic: true,
      autoResume: false,
      metadata: {},
    });
    // A sandbox that is ours and ended, on the same node, proves the reconciler has passed over this node.
    const id = await create();
    const placedOn = (await env.db.query("SELECT node_id FROM sandboxes WHERE id = $1", [id])).rows[0].node_id;
    await env.db.query("UPDATE sandboxes SET state = 'killed', node_id = 'node-r5' WHERE id = $1", [id]);
    env.nodes.get(placedOn)?.sandboxes.delete(id);
    await node.create({ ...(env.nodes.get(placedOn)?.created.at(-1) ?? ({} as never)), sandboxId: id });
    await eventually(async () => (node.killed.includes(id) ? true : undefined), "our orphan killed");
    expect(node.sandboxes.has("foreign-sandbox")).toBe(true);
  });

  it("leaves alone the copy on another node of a sandbox whose row is resuming (a move), not after it settles", async () => {
    const target = await env.addNode("node-r6");
    const id = await create();
    const placedOn = (await env.db.query("SELECT node_id FROM sandboxes WHERE id = $1", [id])).rows[0].node_id;
    const request = env.nodes.get(placedOn)?.created.find((r) => r.sandboxId === id);
    if (!request || placedOn === "node-r6") throw new Error(`unexpected placement on ${placedOn}`);
    await env.db.query("UPDATE sandboxes SET state = 'resuming' WHERE id = $1", [id]);
    // The move's new instance, started before the row names its node.
    target.sandboxes.set(id, { exec: "moved", state: "running", request });
    // An ended sandbox of ours on the same node proves the reconciler has passed over it meanwhile.
    const marker = await create();
    const markerOn = (await env.db.query("SELECT node_id FROM sandboxes WHERE id = $1", [marker])).rows[0].node_id;
    await env.db.query("UPDATE sandboxes SET state = 'killed', node_id = 'node-r6' WHERE id = $1", [marker]);
    env.nodes.get(markerOn)?.sandboxes.delete(marker);
    target.sandboxes.set(marker, { exec: "marker", state: "running", request: { ...request, sandboxId: marker } });
    await eventually(async () => (target.killed.includes(marker) ? true : undefined), "marker killed");
    expect(target.killed).not.toContain(id);
    // Settled on its old node (the move failed): the copy is an orphan now.
    await env.db.query("UPDATE sandboxes SET state = 'running' WHERE id = $1", [id]);
    await eventually(async () => (target.killed.includes(id) ? true : undefined), "stale copy killed");
  });
});

describe("reconciliation across a heartbeat gap", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start({ nodeDownAfterMs: 600_000 });
    ({ apiKey } = await env.team("gap"));
  });
  afterAll(() => env.stop());

  const lastSeen = async (node: string) =>
    (await env.db.query<{ t: Date }>("SELECT last_seen_at AS t FROM nodes WHERE id = $1", [node])).rows[0]?.t;

  it("a node whose heartbeat vanished (Redis restarted) is not marked down within the grace period", async () => {
    await env.addNode("gap-node", { memoryTotalBytes: 1024 ** 3 });
    const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    const { sandboxID } = res.body as { sandboxID: string };
    await eventually(async () => (await lastSeen("gap-node")) ?? undefined, "node recorded");
    // Redis loses everything: the heartbeat key and the set; a second node keeps beating as a witness.
    await env.redis.del(NODES_SET_KEY, nodeKey("gap-node"));
    await env.addNode("witness");
    const gapStart = new Date();
    for (let passes = 0; passes < 3; passes++) {
      const seen = await eventually(async () => {
        const t = await lastSeen("witness");
        return t && t > gapStart ? t : undefined;
      }, "a reconcile pass");
      gapStart.setTime(seen.getTime());
      await env.heartbeat("witness");
    }
    const node = await env.db.query("SELECT state FROM nodes WHERE id = 'gap-node'");
    expect(node.rows[0].state).toBe("up");
    const info = await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey });
    expect((info.body as { state: string }).state).toBe("running");
  });
});
