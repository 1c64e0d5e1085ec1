import { Sandbox, SandboxNotFoundError } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestEnv } from "./api-harness.js";

/** The official e2b SDK (2.51.0) against the api, with node agents faked behind NodeAgentClient. */
describe("e2b SDK against the api", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
    ({ apiKey } = await env.team("sdk"));
    process.env.E2B_API_URL = env.api.url;
    process.env.E2B_API_KEY = apiKey;
    process.env.E2B_DOMAIN = "warren.test";
  });
  afterAll(() => env.stop());

  it("Sandbox.create returns a sandbox with an envd access token and a recent envd version", async () => {
    const sbx = await Sandbox.create({ metadata: { test: "create" }, envs: { FOO: "bar" } });
    expect(sbx.sandboxId).toMatch(/^[a-z0-9]+$/);
    const created = env.nodes.get("node-a")?.created.find((c) => c.sandboxId === sbx.sandboxId);
    expect(created?.envVars).toEqual({ FOO: "bar" });
    expect(created?.templateId).toBe("base");
    // The SDK sends the token it got at create to envd; the node got the same one for /init.
    expect((sbx as unknown as { envdAccessToken: string }).envdAccessToken).toBe(created?.envdAccessToken);
    const info = await sbx.getInfo();
    expect(info.sandboxId).toBe(sbx.sandboxId);
    expect(info.templateId).toBe("base");
    expect(info.metadata).toEqual({ test: "create" });
    expect(info.state).toBe("running");
    expect(info.envdVersion).toBe("0.6.4");
    expect(info.endAt.getTime() - info.startedAt.getTime()).toBeGreaterThan(290_000);
    await sbx.kill();
  });

  it("Sandbox.list filters by metadata (triple-encoded) and state, and paginates with nextToken", async () => {
    const tag = `list-${Date.now()}`;
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const sbx = await Sandbox.create({ metadata: { tag, "odd key&": "v=a l", i: String(i) } });
      ids.push(sbx.sandboxId);
    }
    const other = await Sandbox.create({ metadata: { tag: "other" } });
    const paginator = Sandbox.list({ query: { metadata: { tag, "odd key&": "v=a l" }, state: ["running"] }, limit: 2 });
    const first = await paginator.nextItems();
    expect(first).toHaveLength(2);
    expect(paginator.hasNext).toBe(true);
    const second = await paginator.nextItems();
    expect(second).toHaveLength(1);
    expect(paginator.hasNext).toBe(false);
    const seen = [...first, ...second].map((s) => s.sandboxId);
    // Newest first by default.
    expect(seen).toEqual([...ids].reverse());
    const asc = await Sandbox.list({ query: { metadata: { tag } }, order: "asc" }).nextItems();
    expect(asc.map((s) => s.sandboxId)).toEqual(ids);
    const paused = await Sandbox.list({ query: { metadata: { tag }, state: ["paused"] } }).nextItems();
    expect(paused).toEqual([]);
    for (const id of [...ids, other.sandboxId]) await Sandbox.kill(id);
  });

  it("a last page exactly `limit` long has no next token", async () => {
    const tag = `exact-${Date.now()}`;
    const a = await Sandbox.create({ metadata: { tag } });
    const b = await Sandbox.create({ metadata: { tag } });
    const paginator = Sandbox.list({ query: { metadata: { tag } }, limit: 2 });
    expect(await paginator.nextItems()).toHaveLength(2);
    expect(paginator.hasNext).toBe(false);
    await a.kill();
    await b.kill();
  });

  it("setTimeout may shorten endAt and connect never shortens it", async () => {
    const sbx = await Sandbox.create({ timeoutMs: 600_000 });
    await sbx.setTimeout(120_000);
    const shortened = await sbx.getInfo();
    expect(shortened.endAt.getTime() - Date.now()).toBeLessThan(121_000);
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 });
    const afterShortConnect = await sbx.getInfo();
    expect(afterShortConnect.endAt.getTime()).toBe(shortened.endAt.getTime());
    const connected = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 900_000 });
    expect(connected.sandboxId).toBe(sbx.sandboxId);
    const extended = await sbx.getInfo();
    expect(extended.endAt.getTime()).toBeGreaterThan(shortened.endAt.getTime());
    await sbx.kill();
  });

  it("pause of a paused sandbox returns false (409) and connect resumes it", async () => {
    const sbx = await Sandbox.create();
    expect(await sbx.pause()).toBe(true);
    expect((await sbx.getInfo()).state).toBe("paused");
    expect(await sbx.pause()).toBe(false);
    const resumed = await Sandbox.connect(sbx.sandboxId);
    expect(resumed.sandboxId).toBe(sbx.sandboxId);
    expect((await sbx.getInfo()).state).toBe("running");
    await sbx.kill();
  });

  it("kill of an unknown sandbox returns false; connect and getInfo of a killed one throw SandboxNotFoundError", async () => {
    expect(await Sandbox.kill("doesnotexist0000000")).toBe(false);
    const sbx = await Sandbox.create();
    expect(await sbx.kill()).toBe(true);
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
    await expect(Sandbox.connect(sbx.sandboxId)).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(Sandbox.getInfo(sbx.sandboxId)).rejects.toBeInstanceOf(SandboxNotFoundError);
    expect(env.nodes.get("node-a")?.killed).toContain(sbx.sandboxId);
  });
});
