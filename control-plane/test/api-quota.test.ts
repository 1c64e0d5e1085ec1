import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestEnv } from "./api-harness.js";

/** Per-team limits answered with 429 + Retry-After (integer seconds, as the SDK's retry expects). */
describe("api quotas", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
  });
  afterAll(() => env.stop());

  it("refuses a create beyond the team's concurrent sandboxes with 429 and Retry-After", async () => {
    const { apiKey } = await env.team("concurrency", { maxConcurrentSandboxes: 2 });
    const ok = [];
    for (let i = 0; i < 2; i++) {
      const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
      expect(res.status).toBe(201);
      ok.push((res.body as { sandboxID: string }).sandboxID);
    }
    const refused = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    expect(refused.status).toBe(429);
    expect(refused.body).toMatchObject({ code: 429 });
    expect(refused.headers.get("retry-after")).toMatch(/^\d+$/);
    // Killing one frees a slot.
    await env.request("DELETE", `/sandboxes/${ok[0]}`, { apiKey });
    const after = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    expect(after.status).toBe(201);
  });

  it("refuses creates beyond the team's rate per minute with 429 and a Retry-After within the minute", async () => {
    const { apiKey } = await env.team("rate", { maxCreatesPerMinute: 2 });
    for (let i = 0; i < 2; i++) {
      const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
      expect(res.status).toBe(201);
      await env.request("DELETE", `/sandboxes/${(res.body as { sandboxID: string }).sandboxID}`, { apiKey });
    }
    const refused = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    expect(refused.status).toBe(429);
    const retryAfter = Number(refused.headers.get("retry-after"));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(60);
  });

  it("refuses a timeout longer than the team's maximum length", async () => {
    const { apiKey } = await env.team("short", { maxLengthHours: 1 });
    const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", timeout: 3601 } });
    expect(res.status).toBe(400);
    expect(res.body).toEqual({ code: 400, message: "Timeout cannot be greater than 1 hours" });
  });
});
