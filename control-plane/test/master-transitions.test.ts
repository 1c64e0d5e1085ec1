import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CreateOnNodeRequest, NodeAgentError, type SandboxPlacement } from "../src/master/node-agent-client.js";
import { TestEnv } from "./api-harness.js";

/** One transition at a time per sandbox. */
describe("sandbox state machine", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
    ({ apiKey } = await env.team("transitions"));
  });
  afterAll(() => env.stop());

  it("concurrent pause and kill: both complete in some order, the ledger shows no interleaving", async () => {
    const { sandboxID } = (await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } }))
      .body as { sandboxID: string };
    const [pause, kill] = await Promise.all([
      env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey, body: {} }),
      env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey }),
    ]);
    // Kill either wins (pause then 404) or comes second (204 after pause finished) or finds it pausing (409).
    expect([204, 404, 409]).toContain(pause.status);
    expect([204, 409]).toContain(kill.status);
    const events = await env.db.query<{ from_state: string | null; to_state: string | null }>(
      "SELECT from_state, to_state FROM sandbox_events WHERE sandbox_id = $1 AND to_state IS NOT NULL ORDER BY id",
      [sandboxID],
    );
    // Each transition starts from the state the previous one ended in.
    for (let i = 1; i < events.rows.length; i++) {
      expect(events.rows[i]?.from_state).toBe(events.rows[i - 1]?.to_state);
    }
  });

  it("a kill while the sandbox is starting wins: the create answers 404 and the node's sandbox is removed", async () => {
    const node = env.nodes.get("node-a");
    if (!node) throw new Error("no node");
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const original = node.create.bind(node);
    let startedId = "";
    node.create = async (request: CreateOnNodeRequest): Promise<SandboxPlacement> => {
      startedId = request.sandboxId;
      await gate;
      return original(request);
    };
    const creating = env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    while (!startedId) await new Promise((resolve) => setTimeout(resolve, 10));
    const kill = await env.request("DELETE", `/sandboxes/${startedId}`, { apiKey });
    // A starting sandbox is not visible yet, but its team may kill it.
    expect(kill.status).toBe(204);
    release();
    const created = await creating;
    node.create = original;
    expect(created.status).toBe(404);
    expect(node.sandboxes.has(startedId)).toBe(false);
    const row = await env.db.query("SELECT state FROM sandboxes WHERE id = $1", [startedId]);
    expect(row.rows[0].state).toBe("killed");
  });

  it("setTimeout on a paused sandbox is refused with 409", async () => {
    const { sandboxID } = (await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } }))
      .body as { sandboxID: string };
    await env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey, body: {} });
    const res = await env.request("POST", `/sandboxes/${sandboxID}/timeout`, { apiKey, body: { timeout: 30 } });
    expect(res.status).toBe(409);
    expect(res.body).toMatchObject({ code: 409 });
  });

  it("a node that cannot pause yet: pause answers 501, the sandbox stays running and the ledger says why", async () => {
    const node = env.nodes.get("node-a");
    if (!node) throw new Error("no node");
    const original = node.pause.bind(node);
    node.pause = async () => {
      throw new NodeAgentError("unimplemented", "pause comes with the pause issue");
    };
    const { sandboxID } = (await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } }))
      .body as { sandboxID: string };
    const res = await env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey, body: {} });
    node.pause = original;
    expect(res.status).toBe(501);
    expect(res.body).toMatchObject({ code: 501 });
    const info = await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey });
    expect((info.body as { state: string }).state).toBe("running");
    const events = await env.request("GET", `/warren/v1/sandboxes/${sandboxID}/events`, { apiKey });
    const types = (events.body as { events: { type: string }[] }).events.map((e) => e.type);
    expect(types.slice(-2)).toEqual(["sandbox.pausing", "sandbox.pause_failed"]);
  });
});
