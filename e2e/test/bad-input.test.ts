import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildCorpus, type CorpusTarget, runCorpus } from "../src/bad-input-corpus.js";
import { type ClusterEnv, LocalCluster } from "../src/cluster.js";

// Issue 18's classes kept fixed: a corpus of bad requests against the real api, proxy, envd and code gateway of a
// whole cluster. Every answer is the status that is right for the input (a client error, or E2B's own answer such
// as the proxy's 502 for an unknown sandbox) with a message; no bad create leaves a sandbox; every component still
// answers afterwards.
const TEMPLATES = ["base", "code-interpreter-v1"];
const dataDir = mkdtempSync(join(tmpdir(), "warren-badinput-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "a",
  nodeCidr: () => "10.237.0.0/22",
  readyTemplates: TEMPLATES,
  env: { WARREN_PREBUILD_TEMPLATES: TEMPLATES.join(","), WARREN_POOL_TEMPLATES: TEMPLATES.join(",") },
});
let env: ClusterEnv;
let target: CorpusTarget;

async function apiJson(method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${env.E2B_API_URL}${path}`, {
    method,
    headers: { "Content-Type": "application/json", "X-API-KEY": env.E2B_API_KEY },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

beforeAll(async () => {
  env = await cluster.start();
  const created = await apiJson("POST", "/sandboxes", {
    templateID: "code-interpreter-v1",
    secure: true,
    timeout: 600,
  });
  expect(created.status).toBe(201);
  const sandbox = created.body as { sandboxID: string; envdAccessToken: string; trafficAccessToken: string };
  target = {
    apiUrl: env.E2B_API_URL,
    proxyUrl: env.E2B_SANDBOX_URL,
    apiKey: env.E2B_API_KEY,
    adminToken: env.WARREN_ADMIN_TOKEN,
    sandboxId: sandbox.sandboxID,
    envdAccessToken: sandbox.envdAccessToken,
    trafficAccessToken: sandbox.trafficAccessToken ?? "",
  };
}, 900_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("a corpus of bad requests", () => {
  it("gets the right client error with a message from every component, leaves nothing, and all still answer", async () => {
    const cases = buildCorpus(target);
    const results = await runCorpus(cases);
    const wrong = results
      .filter((r) => !r.case.expect.includes(r.status) || r.message.trim() === "")
      .map((r) => `${r.case.component}: ${r.case.name} → ${r.status} ${r.message.slice(0, 160)}`);
    const serverErrors = results.filter((r) => r.status >= 500 && !r.case.expect.includes(r.status));
    console.log(
      `bad-input corpus: ${results.length} requests (api ${cases.filter((c) => c.component === "api").length}, ` +
        `proxy ${cases.filter((c) => c.component === "proxy").length}, envd ${cases.filter((c) => c.component === "envd").length}, ` +
        `code gateway ${cases.filter((c) => c.component === "code-gateway").length}), unexpected 5xx: ${serverErrors.length}`,
    );
    expect(wrong).toEqual([]);

    // No bad create left a sandbox: the team has the one the test made.
    const listed = await apiJson("GET", "/v2/sandboxes");
    expect((listed.body as { sandboxID: string }[]).map((s) => s.sandboxID)).toEqual([target.sandboxId]);
    // Every component still answers.
    expect((await fetch(`${env.E2B_API_URL}/health`)).status).toBe(200);
    const through = (port: number, path: string) =>
      fetch(`${env.E2B_SANDBOX_URL}${path}`, {
        headers: {
          "E2b-Sandbox-Id": target.sandboxId,
          "E2b-Sandbox-Port": String(port),
          "e2b-traffic-access-token": target.trafficAccessToken,
          "X-Access-Token": target.envdAccessToken,
        },
      });
    expect((await through(49983, "/health")).status).toBeLessThan(300);
    expect((await through(49999, "/health")).status).toBeLessThan(300);
  }, 180_000);
});
