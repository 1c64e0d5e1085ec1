import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { Template } from "../src/index.js";
import { cleanEnv, warren } from "./cli-harness.js";
import { BUILD_ID, type FakeTemplateApi, send, startFakeTemplateApi, TEMPLATE_ID } from "./template/fake-api.js";
import { makeContext } from "./template/fixtures.js";

// `warren template ...` as a child process (the built CLI) against a recording stand-in of the template API:
// what it sends, what it prints on stdout (results, --json) and stderr (progress, errors), its exit codes.

let api: FakeTemplateApi;
let ctx: string;
// One data dir for the file's CLI runs (none of them keeps state there), removed at the end.
const dataDir = mkdtempSync(join(tmpdir(), "warren-cli-tpl-data-"));
const env = () =>
  cleanEnv({
    WARREN_API_URL: api.url,
    WARREN_API_KEY: "cli-key",
    WARREN_DATA_DIR: dataDir,
  });

beforeAll(async () => {
  api = await startFakeTemplateApi();
  ctx = makeContext();
  writeFileSync(
    join(ctx, "Dockerfile"),
    "FROM ubuntu:22.04\nCOPY hello.txt /app/\nRUN echo built > /tmp/x\nLABEL skipped=yes\nCMD python3 -m http.server\n",
  );
});
beforeEach(() => api.reset());
afterAll(async () => {
  await api?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

const LISTED = {
  templateID: TEMPLATE_ID,
  buildID: BUILD_ID,
  buildStatus: "ready",
  cpuCount: 2,
  memoryMB: 1024,
  diskSizeMB: 2048,
  envdVersion: "0.6.4",
  public: false,
  names: ["acme/myname"],
  aliases: ["myname"],
  createdAt: "2026-01-01T10:00:00Z",
  updatedAt: "2026-01-01T11:00:00Z",
  lastSpawnedAt: null,
  spawnCount: 0,
  buildCount: 1,
};

describe("warren template build", () => {
  test("a Dockerfile in the context: the same trigger body as the SDK's, the template id alone on stdout", async () => {
    const res = await warren(
      ["template", "build", "myname:v1", "--context", ctx, "--tag", "stable", "--cpu", "2"],
      env(),
    );
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toBe(`${TEMPLATE_ID}\n`);
    expect(res.stderr).toContain("Unsupported instruction: LABEL");
    expect(res.stderr).toContain("[builder 2/2] RUN echo hi");
    expect(res.stderr).toContain(`built myname:v1: template ${TEMPLATE_ID}`);

    const create = api.calls.find((c) => c.url === "/v3/templates");
    expect(JSON.parse(String(create?.body))).toEqual({ name: "myname:v1", tags: ["stable"], cpuCount: 2 });
    const trigger = api.calls.find((c) => c.url.startsWith("/v2/templates/"));
    const sdkTemplate = Template({ fileContextPath: ctx }).fromDockerfile(join(ctx, "Dockerfile"));
    expect(JSON.parse(String(trigger?.body))).toEqual(JSON.parse(await Template.toJSON(sdkTemplate)));
    expect(api.uploads.size).toBe(1);
  });

  test("--json prints the BuildInfo with its status and nothing on stderr", async () => {
    const res = await warren(["template", "build", "myname", "--context", ctx, "--json", "--no-cache"], env());
    expect(res.code, res.stderr).toBe(0);
    expect(JSON.parse(res.stdout)).toEqual({
      alias: "myname",
      name: "myname",
      tags: ["default"],
      templateId: TEMPLATE_ID,
      buildId: BUILD_ID,
      status: "ready",
    });
    expect(res.stderr).toBe("");
    const trigger = api.calls.find((c) => c.url.startsWith("/v2/templates/"));
    expect(JSON.parse(String(trigger?.body)).force).toBe(true);
  });

  test("a template file with --start-cmd/--ready-cmd and a memory size", async () => {
    const file = join(ctx, "t.json");
    writeFileSync(
      file,
      JSON.stringify({
        fromTemplate: "base",
        steps: [
          { type: "RUN", args: ["echo hi > /tmp/x"] },
          { type: "COPY", args: ["app", "/app"] },
        ],
      }),
    );
    const res = await warren(
      [
        "template",
        "build",
        "fromfile",
        "--template-file",
        file,
        "--context",
        ctx,
        "--memory-mb",
        "2048",
        "--start-cmd",
        "srv",
        "--ready-cmd",
        "true",
        "--json",
      ],
      env(),
    );
    expect(res.code, res.stderr).toBe(0);
    const create = JSON.parse(String(api.calls.find((c) => c.url === "/v3/templates")?.body));
    expect(create).toEqual({ name: "fromfile", memoryMB: 2048 });
    const trigger = JSON.parse(String(api.calls.find((c) => c.url.startsWith("/v2/templates/"))?.body));
    expect(trigger).toMatchObject({ fromTemplate: "base", startCmd: "srv", readyCmd: "true", force: false });
    expect(trigger.steps[1]).toMatchObject({ type: "COPY", args: ["app", "/app", "", ""] });
    expect(trigger.steps[1].filesHash).toMatch(/^[0-9a-f]{64}$/);
  });

  test("a failed build: exit 1, the reason on stderr, with --json the BuildInfo and status error on stdout", async () => {
    api.final = { status: "error", reason: { message: "command failed: exit status 1", step: "2" } };
    const res = await warren(["template", "build", "broken", "--context", ctx, "--json"], env());
    expect(res.code).toBe(1);
    expect(JSON.parse(res.stdout)).toMatchObject({
      templateId: TEMPLATE_ID,
      status: "error",
      reason: "command failed: exit status 1",
    });
    expect(res.stderr).toContain("warren: command failed: exit status 1");
  });

  test("usage errors: no Dockerfile, both sources, a bad template file (exit 2)", async () => {
    const empty = mkdtempSync(join(tmpdir(), "warren-empty-ctx-"));
    try {
      const none = await warren(["template", "build", "x", "--context", empty], env());
      expect(none.code).toBe(2);
      expect(none.stderr).toContain("no e2b.Dockerfile or Dockerfile in");
      const both = await warren(
        ["template", "build", "x", "-f", "Dockerfile", "--template-file", "t.json", "--context", ctx],
        env(),
      );
      expect(both.code).toBe(2);
      writeFileSync(join(empty, "bad.json"), JSON.stringify({ fromImage: "a", steps: [{ type: "NOPE", args: [] }] }));
      const bad = await warren(
        ["template", "build", "x", "--template-file", join(empty, "bad.json"), "--context", empty],
        env(),
      );
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain("steps[0].type");
      expect(api.calls).toEqual([]);
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  });

  test("a refused create (401) exits 5 with the auth hint", async () => {
    api.override = (_call, res) => {
      send(res, 401, { code: 401, message: "Invalid API key" });
      return true;
    };
    const res = await warren(["template", "build", "x", "--context", ctx], env());
    expect(res.code).toBe(5);
    expect(res.stderr).toContain("Unauthorized");
  });
});

describe("warren template list, info, tags, delete", () => {
  test("list: a table, or JSON", async () => {
    api.override = (call, res) => {
      send(res, 200, call.url === "/templates" ? [LISTED] : []);
      return true;
    };
    const text = await warren(["template", "list"], env());
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(
      new RegExp(`TEMPLATE ID\\s+NAMES\\s+STATUS[\\s\\S]*${TEMPLATE_ID}\\s+acme/myname\\s+ready`),
    );
    const json = await warren(["template", "ls", "--json"], env());
    expect(JSON.parse(json.stdout)).toEqual([
      expect.objectContaining({ templateId: TEMPLATE_ID, createdAt: "2026-01-01T10:00:00.000Z" }),
    ]);
  });

  test("info: the template, its tags and builds; an unknown one exits 6", async () => {
    api.override = (call, res) => {
      if (call.url.includes("gone")) send(res, 404, { code: 404, message: "template 'gone' not found" });
      else if (call.url.endsWith("/tags"))
        send(res, 200, [{ tag: "default", buildID: BUILD_ID, createdAt: "2026-01-01T10:00:00Z" }]);
      else
        send(res, 200, {
          ...LISTED,
          builds: [
            {
              buildID: BUILD_ID,
              status: "ready",
              createdAt: LISTED.createdAt,
              updatedAt: LISTED.updatedAt,
              cpuCount: 2,
              memoryMB: 1024,
            },
          ],
        });
      return true;
    };
    const res = await warren(["template", "info", "myname", "--json"], env());
    expect(res.code, res.stderr).toBe(0);
    expect(JSON.parse(res.stdout)).toMatchObject({
      templateId: TEMPLATE_ID,
      tags: [{ tag: "default", buildId: BUILD_ID }],
      builds: [{ buildId: BUILD_ID, status: "ready" }],
    });
    const text = await warren(["template", "info", "myname"], env());
    expect(text.stdout).toContain(`template  ${TEMPLATE_ID}`);
    const gone = await warren(["template", "info", "gone"], env());
    expect(gone.code).toBe(6);
    expect(gone.stderr).toContain("hint: `warren template list`");
  });

  test("tags: list, --assign, --remove", async () => {
    api.override = (call, res) => {
      if (call.method === "POST") send(res, 201, { buildID: BUILD_ID, tags: ["prod"] });
      else if (call.method === "DELETE") send(res, 204);
      else send(res, 200, [{ tag: "default", buildID: BUILD_ID, createdAt: "2026-01-01T10:00:00Z" }]);
      return true;
    };
    const list = await warren(["template", "tags", "myname"], env());
    expect(list.stdout).toMatch(new RegExp(`default\\s+${BUILD_ID}`));
    const assign = await warren(["template", "tags", "myname:v1", "--assign", "prod", "--json"], env());
    expect(JSON.parse(assign.stdout)).toEqual({ name: "myname:v1", buildId: BUILD_ID, tags: ["prod"] });
    const remove = await warren(["template", "tags", "myname", "--remove", "prod", "--remove", "qa"], env());
    expect(remove.code).toBe(0);
    expect(api.calls.map((c) => `${c.method} ${c.url} ${c.body.toString()}`)).toEqual([
      "GET /templates/myname/tags ",
      'POST /templates/tags {"target":"myname:v1","tags":["prod"]}',
      'DELETE /templates/tags {"name":"myname","tags":["prod","qa"]}',
    ]);
  });

  test("delete: deleted ones, and exit 6 when one is unknown", async () => {
    api.override = (call, res) => {
      if (call.url.endsWith("gone")) send(res, 404, { code: 404, message: "not found" });
      else send(res, 204);
      return true;
    };
    const ok = await warren(["template", "delete", "myname"], env());
    expect(ok).toMatchObject({ code: 0, stdout: "deleted myname\n" });
    const mixed = await warren(["template", "rm", "a", "gone", "--json"], env());
    expect(mixed.code).toBe(6);
    expect(JSON.parse(mixed.stdout)).toEqual([
      { template: "a", deleted: true },
      { template: "gone", deleted: false },
    ]);
  });
});
