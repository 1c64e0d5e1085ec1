import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ApiServer } from "../src/api/server.js";
import { silentLogger } from "../src/master/log.js";
import { DATABASE_URL, type FakeNodeAgent, TestEnv } from "./api-harness.js";

/** The proxy's auto-resume call: `POST /warren/v1/internal/sandboxes/{id}/resume` on the api → master. */
describe("auto-resume on traffic (internal endpoint)", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;
  const internalToken = randomBytes(24).toString("hex");
  let internal: ApiServer;
  let node: FakeNodeAgent;
  let apiKey: string;
  let resumes = 0;

  beforeAll(async () => {
    await env.start();
    node = await env.addNode("node-a");
    const resume = node.resume.bind(node);
    node.resume = async (request) => {
      resumes++;
      // A resume that takes a while, so concurrent callers overlap.
      await new Promise((resolve) => setTimeout(resolve, 200));
      return resume(request);
    };
    ({ apiKey } = await env.team("a"));
    internal = await ApiServer.start({
      config: {
        port: 0,
        host: "127.0.0.1",
        databaseUrl: DATABASE_URL,
        schema: env.schema,
        masterUrl: env.masters[0]?.url ?? "",
        adminToken: "",
        internalToken,
      },
      log: silentLogger,
    });
  });
  afterAll(async () => {
    await internal?.stop();
    await env.stop();
  });

  const create = async (body: Record<string, unknown>) => {
    const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base", ...body } });
    expect(res.status).toBe(201);
    return res.body as { sandboxID: string; envdAccessToken: string; trafficAccessToken: string | null };
  };
  const pause = async (id: string, memory = true) =>
    expect((await env.request("POST", `/sandboxes/${id}/pause`, { apiKey, body: { memory } })).status).toBe(204);
  const resumeCall = (id: string, body: Record<string, unknown>, token = internalToken) =>
    fetch(`${internal.url}/warren/v1/internal/sandboxes/${id}/resume`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Warren-Internal-Token": token },
      body: JSON.stringify(body),
    });
  const state = async (id: string) =>
    ((await env.request("GET", `/sandboxes/${id}`, { apiKey })).body as { state: string }).state;

  it("refuses callers without the internal token, also on an api where none is configured", async () => {
    const sandbox = await create({ autoPause: true, autoResume: { enabled: true } });
    expect((await resumeCall(sandbox.sandboxID, { port: 8000 }, "wrong-token-wrong-token")).status).toBe(401);
    const disabled = await fetch(`${env.api.url}/warren/v1/internal/sandboxes/${sandbox.sandboxID}/resume`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Warren-Internal-Token": internalToken },
      body: JSON.stringify({ port: 8000 }),
    });
    expect(disabled.status).toBe(401);
  });

  it("many concurrent calls for a paused auto-resume sandbox make one resume", async () => {
    const sandbox = await create({ autoPause: true, autoResume: { enabled: true } });
    await pause(sandbox.sandboxID);
    const before = resumes;
    const answers = await Promise.all(
      Array.from({ length: 8 }, () =>
        resumeCall(sandbox.sandboxID, { port: 49983, envdAccessToken: sandbox.envdAccessToken }),
      ),
    );
    expect(answers.map((r) => r.status)).toEqual(Array(8).fill(200));
    const bodies = (await Promise.all(answers.map((r) => r.json()))) as { resumed: boolean }[];
    expect(bodies.filter((b) => b.resumed)).toHaveLength(8);
    expect(resumes - before).toBe(1);
    expect(await state(sandbox.sandboxID)).toBe("running");
    const again = await resumeCall(sandbox.sandboxID, { port: 8000 });
    expect(await again.json()).toEqual({ resumed: false });
  });

  it("checks the tokens the request carried: envd port needs the envd token, a private sandbox the traffic token", async () => {
    const sandbox = await create({
      autoPause: true,
      autoResume: { enabled: true },
      network: { allowPublicTraffic: false },
    });
    await pause(sandbox.sandboxID);
    expect((await resumeCall(sandbox.sandboxID, { port: 49983, envdAccessToken: "nope" })).status).toBe(403);
    expect((await resumeCall(sandbox.sandboxID, { port: 49983 })).status).toBe(403);
    expect((await resumeCall(sandbox.sandboxID, { port: 8000, trafficAccessToken: "nope" })).status).toBe(403);
    expect(await state(sandbox.sandboxID)).toBe("paused");
    const ok = await resumeCall(sandbox.sandboxID, {
      port: 8000,
      trafficAccessToken: sandbox.trafficAccessToken,
    });
    expect(ok.status).toBe(200);
    expect(await state(sandbox.sandboxID)).toBe("running");
  });

  it("answers 404 without the auto-resume policy, after a filesystem-only pause, and for unknown sandboxes", async () => {
    const plain = await create({});
    await pause(plain.sandboxID);
    expect((await resumeCall(plain.sandboxID, { port: 8000 })).status).toBe(404);
    const filesystemOnly = await create({ autoPause: true, autoResume: { enabled: true } });
    await pause(filesystemOnly.sandboxID, false);
    expect((await resumeCall(filesystemOnly.sandboxID, { port: 8000 })).status).toBe(404);
    expect(await state(filesystemOnly.sandboxID)).toBe("paused");
    expect((await resumeCall("nosuchsandbox", { port: 8000 })).status).toBe(404);
    expect((await resumeCall(plain.sandboxID, { port: 0 })).status).toBe(400);
  });
});
