import { Sandbox, ServiceBusyError } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SnapshotOnNode } from "../src/master/node-agent-client.js";
import { type FakeNodeAgent, TestEnv } from "./api-harness.js";

/**
 * E2B protocol items of issue 19 on the wire, with fake node agents: `mcp` at create (kept as server names,
 * shown in the detail, refused with a 400 naming the problem when malformed), the snapshot mode of newer SDKs
 * (`memory` and `mode: 'full' | 'filesystem'` on pause and createSnapshot, down to the node's files-only capture)
 * and 503 as the busy answer the SDK turns into ServiceBusyError.
 */
describe("api: mcp, snapshot mode and busy answers as E2B's SDKs send and read them", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;
  let apiKey: string;
  let node: FakeNodeAgent;
  /** The options each node snapshot was asked with. */
  const snapshotCalls: { sandboxId: string; filesOnly: boolean }[] = [];

  beforeAll(async () => {
    await env.start();
    node = await env.addNode("node-h1b");
    // Plays a driver that keeps memory unless asked for files only (the namespace driver with CRIU).
    const capture = node.snapshot.bind(node);
    node.snapshotsKeepMemory = true;
    node.snapshot = async (sandboxId, snapshotId, options?: { readonly filesOnly?: boolean }) => {
      const filesOnly = options?.filesOnly === true;
      snapshotCalls.push({ sandboxId, filesOnly });
      const made: SnapshotOnNode = await capture(sandboxId, snapshotId);
      const kept = { ...made, memory: made.memory && !filesOnly };
      node.snapshots.set(snapshotId, { ...kept, sourceSandboxId: sandboxId });
      return kept;
    };
    ({ apiKey } = await env.team("h1b", { maxConcurrentSandboxes: 100, maxCreatesPerMinute: 1000 }));
  });
  afterAll(() => env.stop());

  const create = async (body: Record<string, unknown>) => {
    const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", ...body } });
    expect(res.status, res.text).toBe(201);
    return (res.body as { sandboxID: string }).sandboxID;
  };
  const pausedWithMemory = async (sandboxId: string): Promise<boolean | undefined> => {
    const rows = await env.db.query<{ data: { memory?: boolean } }>(
      "SELECT data FROM sandbox_events WHERE sandbox_id = $1 AND type = 'sandbox.paused' ORDER BY id DESC LIMIT 1",
      [sandboxId],
    );
    return rows.rows[0]?.data.memory;
  };

  it("create with mcp keeps the server names (not their configs) and shows them in the detail", async () => {
    const body = { mcp: { exa: { apiKey: "secret-exa-key" }, "github/e2b-dev/mcp": { runCmd: "x", installCmd: "y" } } };
    for (const path of ["/v2/sandboxes", "/sandboxes"]) {
      const res = await env.request("POST", path, { apiKey, body: { templateID: "base", ...body } });
      expect(res.status, res.text).toBe(201);
      const id = (res.body as { sandboxID: string }).sandboxID;
      const detail = await env.request("GET", `/sandboxes/${id}`, { apiKey });
      expect((detail.body as { mcpServers: string[] }).mcpServers).toEqual(["exa", "github/e2b-dev/mcp"]);
      expect(detail.text).not.toContain("secret-exa-key");
      const stored = await env.db.query("SELECT * FROM sandboxes WHERE id = $1", [id]);
      expect(JSON.stringify(stored.rows[0])).not.toContain("secret-exa-key");
      await env.request("DELETE", `/sandboxes/${id}`, { apiKey });
    }
    const plain = await create({ mcp: null });
    const detail = await env.request("GET", `/sandboxes/${plain}`, { apiKey });
    expect(detail.body).not.toHaveProperty("mcpServers");
  });

  it("a malformed mcp is a 400 naming the problem, and no sandbox is made", async () => {
    const before = node.created.length;
    const cases: [unknown, string][] = [
      [["exa"], "mcp must be an object"],
      ["exa", "mcp must be an object"],
      [{ exa: "key" }, "mcp.exa must be an object"],
      [{ "bad name!": {} }, "'bad name!' is not a server name"],
      [Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`s${i}`, {}])), "at most 64"],
    ];
    for (const [mcp, message] of cases) {
      const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", mcp } });
      expect(res.status, res.text).toBe(400);
      expect((res.body as { message: string }).message).toContain(message);
    }
    expect(node.created.length).toBe(before);
  });

  it("pause takes memory or mode: 'filesystem' pauses files only, 'full' keeps memory, a contradiction is a 400", async () => {
    const cases: [Record<string, unknown>, boolean][] = [
      [{ mode: "filesystem" }, false],
      [{ mode: "full" }, true],
      [{ memory: false }, false],
      [{ memory: false, mode: "filesystem" }, false],
      [{}, true],
    ];
    for (const [body, memory] of cases) {
      const id = await create({});
      const res = await env.request("POST", `/sandboxes/${id}/pause`, { apiKey, body });
      expect(res.status, `${JSON.stringify(body)}: ${res.text}`).toBe(204);
      expect(await pausedWithMemory(id), JSON.stringify(body)).toBe(memory);
    }
    const id = await create({});
    for (const [body, message] of [
      [{ mode: "memory" }, "mode must be 'full' or 'filesystem'"],
      [{ memory: true, mode: "filesystem" }, "contradicts mode 'filesystem'"],
      [{ memory: "no" }, "memory must be a boolean"],
    ] as const) {
      const res = await env.request("POST", `/sandboxes/${id}/pause`, { apiKey, body });
      expect(res.status, res.text).toBe(400);
      expect((res.body as { message: string }).message).toContain(message);
    }
    const info = await env.request("GET", `/sandboxes/${id}`, { apiKey });
    expect((info.body as { state: string }).state).toBe("running");
  });

  it("createSnapshot with mode 'filesystem' (or memory: false) asks the node for files only", async () => {
    const id = await create({});
    const cases: [Record<string, unknown>, boolean][] = [
      [{ mode: "filesystem" }, false],
      [{ memory: false }, false],
      [{ mode: "full" }, true],
      [{}, true],
    ];
    for (const [body, memory] of cases) {
      snapshotCalls.length = 0;
      const res = await env.request("POST", `/sandboxes/${id}/snapshots`, { apiKey, body });
      expect(res.status, res.text).toBe(201);
      expect((res.body as { memory: boolean }).memory, JSON.stringify(body)).toBe(memory);
      // (The leader's durability pass also captures paused sandboxes of other tests: only this one's calls count.)
      expect(snapshotCalls.filter((c) => c.sandboxId === id)).toEqual([{ sandboxId: id, filesOnly: !memory }]);
    }
    snapshotCalls.length = 0;
    const bad = await env.request("POST", `/sandboxes/${id}/snapshots`, {
      apiKey,
      body: { mode: "full", memory: false },
    });
    expect(bad.status).toBe(400);
    expect((bad.body as { message: string }).message).toContain("contradicts mode 'full'");
    expect(snapshotCalls.filter((c) => c.sandboxId === id)).toEqual([]);
  });

  it("the e2b SDK's keepMemory: false arrives as a files-only pause", async () => {
    process.env.E2B_API_URL = env.api.url;
    process.env.E2B_API_KEY = apiKey;
    process.env.E2B_DOMAIN = "warren.test";
    const sbx = await Sandbox.create({ metadata: { test: "keep-memory" } });
    expect(await sbx.pause({ keepMemory: false })).toBe(true);
    expect(await pausedWithMemory(sbx.sandboxId)).toBe(false);
    await Sandbox.kill(sbx.sandboxId);
  });

  it("no capacity is a 503 with E2B's body, which the SDK raises as ServiceBusyError", async () => {
    node.refuse = true;
    try {
      const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
      expect(res.status, res.text).toBe(503);
      expect(res.body).toMatchObject({ code: 503, message: expect.any(String) });
      const error = await Sandbox.create({ metadata: { test: "busy" } }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ServiceBusyError);
    } finally {
      node.refuse = false;
    }
  });
});
