import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NodeAgentError } from "../src/master/node-agent-client.js";
import { eventually, TestEnv } from "./api-harness.js";

/** The timeout evictor: kill at endAt, or pause with autoPause; setTimeout may shorten; the cap holds. */
describe("timeout evictor", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
    ({ apiKey } = await env.team("evict"));
  });
  afterAll(() => env.stop());

  const state = async (id: string) =>
    (
      await env.db.query<{ state: string; end_reason: string | null }>(
        "SELECT state, end_reason FROM sandboxes WHERE id = $1",
        [id],
      )
    ).rows[0];

  it("kills a sandbox when its timeout expires, and it disappears from the API and the node", async () => {
    const { sandboxID } = (
      await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", timeout: 1 } })
    ).body as { sandboxID: string };
    await eventually(async () => ((await state(sandboxID))?.state === "killed" ? true : undefined), "eviction");
    expect((await state(sandboxID))?.end_reason).toBe("timeout");
    expect(env.nodes.get("node-a")?.sandboxes.has(sandboxID)).toBe(false);
    const info = await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey });
    expect(info.status).toBe(404);
  });

  it("pauses instead of killing when the sandbox was created with autoPause", async () => {
    const { sandboxID } = (
      await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", timeout: 1, autoPause: true } })
    ).body as { sandboxID: string };
    await eventually(async () => ((await state(sandboxID))?.state === "paused" ? true : undefined), "auto-pause");
    expect(env.nodes.get("node-a")?.sandboxes.get(sandboxID)?.state).toBe("paused");
    const info = await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey });
    expect(info.body).toMatchObject({ state: "paused", lifecycle: { onTimeout: "pause", autoResume: false } });
  });

  it("setTimeout can shorten a long timeout so that the evictor kills the sandbox", async () => {
    const { sandboxID } = (
      await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", timeout: 3600 } })
    ).body as { sandboxID: string };
    const res = await env.request("POST", `/sandboxes/${sandboxID}/timeout`, { apiKey, body: { timeout: 1 } });
    expect(res.status).toBe(204);
    await eventually(async () => ((await state(sandboxID))?.state === "killed" ? true : undefined), "eviction");
  });

  it("caps setTimeout at the team's maximum length from the sandbox's start", async () => {
    const { apiKey: shortKey } = await env.team("short", { maxLengthHours: 1 });
    const { sandboxID } = (
      await env.request("POST", "/v2/sandboxes", { apiKey: shortKey, body: { templateID: "base" } })
    ).body as { sandboxID: string };
    await env.request("POST", `/sandboxes/${sandboxID}/timeout`, { apiKey: shortKey, body: { timeout: 5 * 3600 } });
    const row = (
      await env.db.query<{ started_at: Date; end_at: Date }>("SELECT started_at, end_at FROM sandboxes WHERE id = $1", [
        sandboxID,
      ])
    ).rows[0];
    expect((row?.end_at.getTime() ?? 0) - (row?.started_at.getTime() ?? 0)).toBeLessThanOrEqual(3600_000);
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: shortKey });
  });

  it("kills an expired autoPause sandbox whose node cannot pause, instead of retrying forever", async () => {
    const node = env.nodes.get("node-a");
    if (!node) throw new Error("no node");
    const original = node.pause.bind(node);
    node.pause = async () => {
      throw new NodeAgentError("unimplemented", "no pause on this node");
    };
    const { sandboxID } = (
      await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", timeout: 1, autoPause: true } })
    ).body as { sandboxID: string };
    await eventually(async () => ((await state(sandboxID))?.state === "killed" ? true : undefined), "fallback kill");
    node.pause = original;
    expect((await state(sandboxID))?.end_reason).toBe("timeout_pause_failed");
  });
});
