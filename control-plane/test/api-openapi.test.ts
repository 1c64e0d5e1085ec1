import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseSecretKeys } from "../src/store/secret-box.js";
import { createApiKey } from "../src/store/teams.js";
import { TestEnv } from "./api-harness.js";

/**
 * The routes the sandbox tests do not reach (volumes, secrets, templates, exec policy, admin) answer what the
 * OpenAPI document says: every request below goes through the harness, which checks each answer against it.
 */
describe("api answers match the OpenAPI document", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;
  let volumesDir: string;
  let apiKey: string;
  let approverKey: string;
  let teamId: string;

  beforeAll(async () => {
    volumesDir = await mkdtemp(join(tmpdir(), "warren-openapi-volumes-"));
    await env.start(
      {},
      {
        volumesDir,
        volumeQuotaMB: 16,
        secretKeys: parseSecretKeys(`k1:${randomBytes(32).toString("base64")}`),
      },
    );
    await env.addNode("node-a");
    ({ apiKey, teamId } = await env.team("contract"));
    approverKey = (await createApiKey(env.db, teamId, "approver", true)).key;
  });
  afterAll(async () => {
    await env.stop();
    await rm(volumesDir, { recursive: true, force: true });
  });

  it("volumes: create, list, get, stat and delete", async () => {
    const created = await env.request("POST", "/volumes", { apiKey, body: { name: "data" } });
    expect(created.status).toBe(201);
    const { volumeID } = created.body as { volumeID: string };
    expect((await env.request("GET", "/volumes", { apiKey })).status).toBe(200);
    const info = await env.request("GET", `/volumes/${volumeID}`, { apiKey });
    expect(info.status).toBe(200);
    const token = (info.body as { token: string }).token;
    const bearer = { Authorization: `Bearer ${token}` };
    const dir = await env.request("POST", `/volumecontent/${volumeID}/dir?path=/logs`, { headers: bearer });
    expect(dir.status).toBe(201);
    expect((await env.request("GET", `/volumecontent/${volumeID}/dir?path=/`, { headers: bearer })).status).toBe(200);
    expect((await env.request("GET", `/volumecontent/${volumeID}/path?path=/logs`, { headers: bearer })).status).toBe(
      200,
    );
    expect((await env.request("DELETE", `/volumes/${volumeID}`, { apiKey })).status).toBe(204);
    expect((await env.request("GET", `/volumes/${volumeID}`, { apiKey })).status).toBe(404);
  });

  it("secrets: create, list, get, update, grant and delete", async () => {
    const created = await env.request("POST", "/secrets", {
      apiKey,
      body: { name: "db-password", value: "hunter2", metadata: { owner: "ops" } },
    });
    expect(created.status).toBe(201);
    expect(created.text).not.toContain("hunter2");
    const { secretID } = created.body as { secretID: string };
    expect((await env.request("GET", "/secrets", { apiKey })).status).toBe(200);
    expect((await env.request("GET", `/secrets/${secretID}`, { apiKey })).status).toBe(200);
    const updated = await env.request("POST", `/secrets/${secretID}`, { apiKey, body: { value: "hunter3" } });
    expect(updated.status).toBe(200);
    const sandbox = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    const { sandboxID } = sandbox.body as { sandboxID: string };
    const grant = await env.request("POST", `/warren/v1/sandboxes/${sandboxID}/secret-grants`, {
      apiKey,
      body: { env: { DB_PASSWORD: "db-password" } },
    });
    expect(grant.status).toBe(201);
    expect((await env.request("DELETE", `/secrets/${secretID}`, { apiKey })).status).toBe(204);
    expect((await env.request("GET", `/secrets/${secretID}`, { apiKey })).status).toBe(404);
  });

  it("templates: create a build, list, get, tags, alias and visibility", async () => {
    const created = await env.request("POST", "/v3/templates", { apiKey, body: { name: "webapp", cpuCount: 2 } });
    expect(created.status).toBe(202);
    const { templateID, buildID } = created.body as { templateID: string; buildID: string };
    expect((await env.request("GET", "/templates", { apiKey })).status).toBe(200);
    expect((await env.request("GET", "/v2/templates", { apiKey })).status).toBe(200);
    expect((await env.request("GET", `/templates/${templateID}`, { apiKey })).status).toBe(200);
    expect((await env.request("GET", `/templates/${templateID}/tags`, { apiKey })).status).toBe(200);
    const status = await env.request("GET", `/templates/${templateID}/builds/${buildID}/status`, { apiKey });
    expect(status.status).toBe(200);
    const link = await env.request("GET", `/templates/${templateID}/files/${"a".repeat(64)}`, { apiKey });
    expect(link.status).toBe(201);
    expect((await env.request("PATCH", `/templates/${templateID}`, { apiKey, body: { public: true } })).status).toBe(
      200,
    );
    expect(
      (await env.request("PATCH", `/v2/templates/${templateID}`, { apiKey, body: { public: false } })).status,
    ).toBe(200);
    expect((await env.request("DELETE", `/templates/${templateID}`, { apiKey })).status).toBe(204);
  });

  it("exec policy: who am I, replace, read, list approvals, clear", async () => {
    expect((await env.request("GET", "/warren/v1/me", { apiKey: approverKey })).status).toBe(200);
    expect((await env.request("GET", "/warren/v1/exec-policy", { apiKey })).body).toEqual({ policy: null });
    const policy = { rules: [{ name: "no curl", command: "curl *", action: "deny" }], reviewTtlSeconds: 600 };
    const put = await env.request("PUT", "/warren/v1/exec-policy", { apiKey: approverKey, body: policy });
    expect(put.status).toBe(200);
    expect((await env.request("GET", "/warren/v1/exec-policy", { apiKey })).status).toBe(200);
    expect((await env.request("GET", "/warren/v1/exec-approvals", { apiKey })).status).toBe(200);
    expect((await env.request("DELETE", "/warren/v1/exec-policy", { apiKey: approverKey })).status).toBe(204);
  });

  it("bodies checked with the document's schemas answer 400s in the api's words", async () => {
    const sandbox = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    const { sandboxID } = sandbox.body as { sandboxID: string };
    const refresh = (body: unknown) => env.request("POST", `/sandboxes/${sandboxID}/refreshes`, { apiKey, body });
    expect((await refresh({ duration: 4000 })).body).toMatchObject({
      code: 400,
      message: "duration must be an integer from 0 to 3600, got 4000",
    });
    expect((await refresh({ duration: "10" })).body).toMatchObject({
      message: 'duration must be an integer from 0 to 3600, got "10"',
    });
    expect((await refresh([1])).body).toMatchObject({ message: "request body must be a JSON object" });
    expect((await refresh({ duration: null })).status).toBe(204);
    const fork = (body: unknown) => env.request("POST", `/sandboxes/${sandboxID}/fork`, { apiKey, body });
    expect((await fork({ count: 0 })).body).toMatchObject({ message: "count must be an integer from 1 to 20, got 0" });
    expect((await fork({ count: 1, timeout: 1.5 })).body).toMatchObject({
      message: "timeout must be an integer from 1 to 2678400, got 1.5",
    });
  });

  it("template, volume, secret, exec policy and admin bodies are refused from the document's schemas", async () => {
    const headers = { "X-Admin-Token": env.adminToken };
    const cases: [string, string, Record<string, unknown>, unknown, string][] = [
      ["POST", "/v3/templates", { apiKey }, { name: "web", cpuCount: 3 }, "cpuCount must be 1 or an even number"],
      ["POST", "/v3/templates", { apiKey }, { name: "web", memoryMB: 129 }, "memoryMB must be an even number"],
      ["POST", "/v3/templates", { apiKey }, { name: "web", tags: "v1" }, "tags must be an array of strings"],
      ["POST", "/v3/templates", { apiKey }, { cpuCount: 2 }, "Name is required"],
      ["POST", "/v2/templates", { apiKey }, { name: "web" }, "Name is required"],
      ["POST", "/templates/tags", { apiKey }, { target: "web" }, "tags is required"],
      ["DELETE", "/templates/tags", { apiKey }, { name: "web:v1", tags: ["v1"] }, "name must be a template's name"],
      ["POST", "/volumes", { apiKey }, { name: "bad name" }, 'Invalid volume name "bad name"'],
      ["POST", "/secrets", { apiKey }, { name: "a{b}", value: "x" }, "name must be 1-128 characters without"],
      ["POST", "/secrets", { apiKey }, { name: "ok" }, "value is required"],
      ["PUT", "/warren/v1/exec-policy", { apiKey: approverKey }, { rules: [], extra: 1 }, "extra"],
      [
        "PUT",
        "/warren/v1/exec-policy",
        { apiKey: approverKey },
        { rules: [{ action: "deny", paths: ["rel"] }] },
        "rules[0].paths[0] must be an absolute path",
      ],
      ["POST", "/warren/v1/admin/teams", { headers }, { name: "t", egressMode: "wide" }, "egressMode must be one of"],
      ["POST", "/warren/v1/admin/teams", { headers }, { name: "t", maxLengthHours: 0 }, "maxLengthHours must be at"],
    ];
    for (const [method, path, auth, body, message] of cases) {
      const res = await env.request(method, path, { ...auth, body });
      expect(res.status, `${method} ${path} ${JSON.stringify(body)}: ${res.text}`).toBe(400);
      expect((res.body as { message: string }).message).toContain(message);
    }
  });

  it("admin: teams, keys and nodes", async () => {
    const headers = { "X-Admin-Token": env.adminToken };
    const created = await env.request("POST", "/warren/v1/admin/teams", { headers, body: { name: "other" } });
    expect(created.status).toBe(201);
    const other = (created.body as { team: { id: string } }).team.id;
    expect((await env.request("GET", "/warren/v1/admin/teams", { headers })).status).toBe(200);
    const patched = await env.request("PATCH", `/warren/v1/admin/teams/${other}`, {
      headers,
      body: { maxConcurrentSandboxes: 3 },
    });
    expect(patched.status).toBe(200);
    const key = await env.request("POST", `/warren/v1/admin/teams/${other}/api-keys`, { headers, body: {} });
    expect(key.status).toBe(201);
    expect((await env.request("GET", `/warren/v1/admin/teams/${other}/api-keys`, { headers })).status).toBe(200);
    expect((await env.request("GET", "/warren/v1/admin/nodes", { headers })).status).toBe(200);
    expect((await env.request("GET", "/health")).status).toBe(200);
  });
});
