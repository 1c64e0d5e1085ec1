import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildCorpus, type CorpusTarget, runCorpus } from "../src/bad-input-corpus.js";
import {
  type Answer,
  createBody,
  createBodyText,
  deepField,
  envdRequest,
  listQuery,
  nastyString,
  type PropertyTarget,
  SERVER_ERROR_CODES,
  sandboxPath,
  sandboxUser,
  send,
  startOutcome,
  urlSafe,
} from "../src/bad-input-properties.js";

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

// The same classes as properties: generated inputs (fast-check; the seed is printed on failure) against the real api
// and envd. Never a server error for what the client sent; every client error has a message; nothing left behind.
describe("generated bad input (property-based)", () => {
  const answers: Answer[] = [];
  const RUNS = Number(process.env.WARREN_FUZZ_RUNS ?? 40);
  const fine = (a: Answer) => a.status < 500 && (a.status < 400 || a.message.trim() !== "");
  const record = (a: Answer | undefined) => {
    if (a) answers.push(a);
    return a === undefined || fine(a);
  };
  const headers = () => ({ "Content-Type": "application/json", "X-API-KEY": env.E2B_API_KEY });
  const options = { numRuns: RUNS, endOnFailure: true } as const;

  it("creates: any body is a 201 (killed at once) or a 4xx with a message, and leaves no sandbox", async () => {
    let created = 0;
    await fc.assert(
      fc.asyncProperty(createBody, deepField, async (body, deep) => {
        const init = { method: "POST", headers: headers(), body: createBodyText(body, deep) };
        let answer = await send("POST /sandboxes", `${env.E2B_API_URL}/sandboxes`, init);
        // A busy node (503) is E2B's answer to load, not to the input: the same body must then get a client answer.
        if (answer?.status === 503) {
          await new Promise((resolve) => setTimeout(resolve, 2_000));
          answer = await send("POST /sandboxes (again)", `${env.E2B_API_URL}/sandboxes`, init);
        }
        if (answer?.status === 201) {
          created++;
          const id = (JSON.parse(answer.text ?? "{}") as { sandboxID?: string }).sandboxID;
          if (id) await fetch(`${env.E2B_API_URL}/sandboxes/${id}`, { method: "DELETE", headers: headers() });
        }
        return record(answer);
      }),
      options,
    );
    // A valid create was killed at once above; a refused one must have left nothing.
    console.log(`generated creates: ${RUNS} bodies, ${created} valid (killed)`);
    const after = (await (await fetch(`${env.E2B_API_URL}/v2/sandboxes`, { headers: headers() })).json()) as {
      sandboxID: string;
    }[];
    expect(after.map((s) => s.sandboxID)).toEqual([target.sandboxId]);
  }, 600_000);

  it("lists and lookups: any filter, cursor or id is a 200 or a 4xx with a message", async () => {
    await fc.assert(
      fc.asyncProperty(listQuery, async (query) => {
        const qs = new URLSearchParams(query as Record<string, string>).toString();
        return record(
          await send(`GET /v2/sandboxes?${qs}`, `${env.E2B_API_URL}/v2/sandboxes?${qs}`, { headers: headers() }),
        );
      }),
      options,
    );
    await fc.assert(
      fc.asyncProperty(nastyString, async (id) =>
        record(
          await send(`GET /sandboxes/${JSON.stringify(id)}`, `${env.E2B_API_URL}/sandboxes/${urlSafe(id)}`, {
            headers: headers(),
          }),
        ),
      ),
      options,
    );
  }, 600_000);

  it("envd: any path, user, command, cwd and env vars is answered without a server error", async () => {
    const created = await apiJson("POST", "/sandboxes", { templateID: "base", timeout: 600 });
    expect(created.status).toBe(201);
    const fuzz = created.body as { sandboxID: string; envdAccessToken?: string };
    const t: PropertyTarget = {
      apiUrl: env.E2B_API_URL,
      proxyUrl: env.E2B_SANDBOX_URL,
      apiKey: env.E2B_API_KEY,
      sandboxId: fuzz.sandboxID,
      envdAccessToken: fuzz.envdAccessToken ?? "",
    };
    try {
      const kind = fc.constantFrom("read", "write", "stat", "list", "mkdir") as fc.Arbitrary<
        "read" | "write" | "stat" | "list" | "mkdir"
      >;
      await fc.assert(
        fc.asyncProperty(kind, sandboxPath, sandboxUser, async (k, path, user) => {
          const request = envdRequest(t, k, path, user);
          return record(await send(request.what, request.url, request.init));
        }),
        { ...options, numRuns: RUNS * 2 },
      );
      const envs = fc.dictionary(fc.oneof(fc.constantFrom("", "A=B", "OK"), nastyString), nastyString, { maxKeys: 3 });
      await fc.assert(
        fc.asyncProperty(
          fc.oneof(fc.constantFrom("/bin/true", "/nonexistent", "", "true"), nastyString),
          fc.array(nastyString, { maxLength: 3 }),
          sandboxPath,
          envs,
          sandboxUser,
          async (cmd, args, cwd, envVars, user) => {
            const request = envdRequest(t, "start", cwd, user, { cmd, args, envs: envVars });
            const outcome = await startOutcome(request.url, request.init);
            if (!outcome) return true;
            answers.push({ what: request.what, status: outcome.status, message: outcome.code ?? "" });
            return outcome.status < 500 && !SERVER_ERROR_CODES.has(outcome.code ?? "");
          },
        ),
        options,
      );
      // envd still answers.
      const health = await fetch(`${env.E2B_SANDBOX_URL}/health`, {
        headers: { "E2b-Sandbox-Id": t.sandboxId, "E2b-Sandbox-Port": "49983" },
      });
      expect(health.status).toBeLessThan(300);
    } finally {
      await apiJson("DELETE", `/sandboxes/${fuzz.sandboxID}`);
    }
    const byStatus = new Map<number, number>();
    for (const a of answers) byStatus.set(a.status, (byStatus.get(a.status) ?? 0) + 1);
    console.log(
      `generated requests: ${answers.length}, by status ${JSON.stringify(Object.fromEntries(byStatus))}, ` +
        `5xx: ${answers.filter((a) => a.status >= 500).length}`,
    );
  }, 900_000);
});
