import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as e2b from "e2b";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import type { TemplateClass, TemplateFromImage, TemplateOptions } from "../src/index.js";
import * as warren from "../src/index.js";
import {
  BUILD_ID,
  type FakeTemplateApi,
  type RecordedCall,
  send,
  startFakeTemplateApi,
  TEMPLATE_ID,
} from "./template/fake-api.js";
import { makeContext } from "./template/fixtures.js";

// A build on the wire (E2B-TEMPLATES.md §1.2): Warren's SDK and the `e2b` SDK run the same template build
// against the same recording server, and must send the same requests (JSON bodies, upload archives, headers)
// and surface the same results and errors.

let api: FakeTemplateApi;
let ctx: string;

beforeAll(async () => {
  api = await startFakeTemplateApi();
  ctx = makeContext();
});
beforeEach(() => api.reset());
afterAll(async () => api?.close());

type Client = "warren" | "e2b";
const opts = () => ({ apiKey: "e2b_key", apiUrl: api.url });

function template(
  client: Client,
  build: (t: TemplateFromImage, waitForPort: (port: number) => warren.ReadyCmd) => TemplateClass,
  options: TemplateOptions = {},
) {
  const factory = (client === "warren" ? warren.Template : e2b.Template) as unknown as (
    o: TemplateOptions,
  ) => TemplateFromImage;
  const waitForPort = (client === "warren" ? warren.waitForPort : e2b.waitForPort) as (port: number) => warren.ReadyCmd;
  return build(factory({ fileContextPath: ctx, ...options }), waitForPort);
}

// biome-ignore lint/suspicious/noExplicitAny: both SDKs' option objects, checked by each SDK
function build(client: Client, t: TemplateClass, name: string, options: Record<string, any> = {}) {
  return client === "warren"
    ? warren.Template.build(t, name, { ...opts(), ...options })
    : e2b.Template.build(t as never, name, { ...opts(), ...options });
}

/** A recorded call in a comparable form: method, path+query, JSON body or archive listing, notable headers. */
function normalize(call: RecordedCall) {
  const isUpload = call.method === "PUT";
  const contentType = String(call.headers["content-type"] ?? "");
  return {
    method: call.method,
    url: call.url,
    body: isUpload
      ? tarListing(call.body)
      : contentType.includes("json")
        ? JSON.parse(call.body.toString())
        : undefined,
    apiKey: call.headers["x-api-key"] ?? null,
    uploadToken: call.headers["x-upload-token"] ?? null,
    // The compressed bytes differ between tar writers; the exact length must be sent and match the body.
    exactLength: isUpload ? Number(call.headers["content-length"]) === call.body.length : undefined,
    chunked: isUpload ? call.headers["transfer-encoding"] === "chunked" : undefined,
  };
}

/** `tar -tv` of an uploaded archive (same machine, so owners and times are comparable). */
function tarListing(archive: Buffer): string[] {
  const gzip = archive[0] === 0x1f && archive[1] === 0x8b;
  const res = spawnSync("tar", [gzip ? "-tzvf" : "-tvf", "-"], { input: archive, encoding: "utf8" });
  return res.stdout.split("\n").filter(Boolean);
}

async function runBoth(scenario: (client: Client) => Promise<unknown>) {
  const outcome = async (client: Client) => {
    api.reset();
    let result: unknown;
    try {
      result = { ok: await scenario(client) };
    } catch (error) {
      const e = error as Error;
      result = { error: { name: e.name, message: e.message } };
    }
    const calls = api.calls.map(normalize);
    // Uploads run concurrently: compare them in a stable order.
    calls.sort((a, b) => (a.method === "PUT" && b.method === "PUT" ? a.url.localeCompare(b.url) : 0));
    return { result, calls };
  };
  const ours = await outcome("warren");
  const theirs = await outcome("e2b");
  return { ours, theirs };
}

const sample = (t: TemplateFromImage, waitForPort: (port: number) => warren.ReadyCmd) =>
  t
    .fromImage("ubuntu:22.04")
    .copy("hello.txt", "/app/")
    .copy("app", "/srv/app", { user: "root", mode: 0o755 })
    .runCmd("echo hi", { user: "root" })
    .setEnvs({ FOO: "bar" })
    .setWorkdir("/app")
    .setStartCmd("python3 -m http.server 8000", waitForPort(8000));

describe("Template.build on the wire, side by side with e2b", () => {
  test("create, upload each COPY's archive, trigger, poll by logsOffset: the same calls", async () => {
    const { ours, theirs } = await runBoth((client) =>
      build(client, template(client, sample), "myname:v1", { tags: ["stable"], cpuCount: 2, memoryMB: 1024 }),
    );
    expect(ours).toEqual(theirs);
    expect(ours.result).toEqual({
      ok: { alias: "myname:v1", name: "myname:v1", tags: ["v1", "stable"], templateId: TEMPLATE_ID, buildId: BUILD_ID },
    });
    const methods = ours.calls.map((c) => `${c.method} ${c.url.replace(/\/[0-9a-f]{64}/, "/<hash>")}`);
    expect(methods).toEqual([
      "POST /v3/templates",
      "GET /templates/k1q7t3v0m2x9c8b4n6z5/files/<hash>",
      "GET /templates/k1q7t3v0m2x9c8b4n6z5/files/<hash>",
      "PUT /upload/<hash>?sig=abc",
      "PUT /upload/<hash>?sig=abc",
      `POST /v2/templates/${TEMPLATE_ID}/builds/${BUILD_ID}`,
      `GET /templates/${TEMPLATE_ID}/builds/${BUILD_ID}/status?logsOffset=0`,
      `GET /templates/${TEMPLATE_ID}/builds/${BUILD_ID}/status?logsOffset=2`,
      `GET /templates/${TEMPLATE_ID}/builds/${BUILD_ID}/status?logsOffset=4`,
    ]);
    for (const put of ours.calls.filter((c) => c.method === "PUT")) {
      expect(put).toMatchObject({ apiKey: null, uploadToken: "upload-token", chunked: false, exactLength: true });
    }
    expect(ours.calls[0]?.body).toEqual({ name: "myname:v1", tags: ["stable"], cpuCount: 2, memoryMB: 1024 });
  });

  test("the log entries handed to onBuildLogs are E2B's", async () => {
    const collect = async (client: Client) => {
      const lines: string[] = [];
      await build(
        client,
        template(client, (t) => t.fromImage("x").copy("hello.txt", "/h")),
        "logs",
        {
          onBuildLogs: (e: { constructor: { name: string }; level: string; message: string; timestamp: Date }) =>
            lines.push(`${e.constructor.name} ${e.level} ${e.message}${e.timestamp instanceof Date ? "" : " NO DATE"}`),
        },
      );
      return lines;
    };
    const ours = await collect("warren");
    const theirs = await collect("e2b");
    expect(ours).toEqual(theirs);
    expect(ours).toContain("LogEntry debug [builder 1/2] COPY");
  });

  test("files the server has are not uploaded, unless forceUpload", async () => {
    const t = (client: Client) =>
      template(client, (b) => b.fromImage("x").copy("hello.txt", "/a").copy("a.txt", "/b", { forceUpload: true }));
    const hashes = JSON.parse(await warren.Template.toJSON(t("warren"))).steps.map(
      (s: { filesHash: string }) => s.filesHash,
    );
    const { ours, theirs } = await runBoth(async (client) => {
      for (const h of hashes) api.present.add(h);
      return build(client, t(client), "cached");
    });
    expect(ours).toEqual(theirs);
    expect(ours.calls.filter((c) => c.method === "PUT").map((c) => c.url)).toEqual([`/upload/${hashes[1]}?sig=abc`]);
  });

  test("skipCache sets the top-level force; buildInBackground stops after the trigger", async () => {
    const { ours, theirs } = await runBoth((client) =>
      client === "warren"
        ? warren.Template.buildInBackground(template(client, sample), "bg", { ...opts(), skipCache: true })
        : e2b.Template.buildInBackground(template(client, sample) as never, "bg", { ...opts(), skipCache: true }),
    );
    expect(ours).toEqual(theirs);
    const trigger = ours.calls.find((c) => c.url.startsWith("/v2/templates"));
    expect(trigger?.body).toMatchObject({ force: true, fromImage: "ubuntu:22.04" });
    expect(ours.calls.some((c) => c.url.includes("/status"))).toBe(false);
  });

  test("a failed build throws BuildError with the reason, after draining the log", async () => {
    const { ours, theirs } = await runBoth(async (client) => {
      api.final = { status: "error", reason: { message: "command failed: exit status 1", step: "2" } };
      return build(
        client,
        template(client, (t) => t.fromImage("x").runCmd("true").runCmd("false")),
        "broken",
      );
    });
    expect(ours).toEqual(theirs);
    expect(ours.result).toEqual({ error: { name: "BuildError", message: "command failed: exit status 1" } });
  });

  test("the BuildError points at the builder call of the failing step", async () => {
    api.final = { status: "error", reason: { message: "boom", step: "1" } };
    const t = warren.Template({ fileContextPath: ctx }).fromImage("x").runCmd("false");
    const error = await warren.Template.build(t, "broken", opts()).catch((e: Error) => e);
    expect(error).toBeInstanceOf(warren.BuildError);
    expect((error as Error).stack).toContain("template-build.test.ts");
  });

  test("an unknown build status ends with 'Unknown build error occurred.'", async () => {
    const { ours, theirs } = await runBoth(async (client) => {
      api.override = (call, res) => {
        if (!call.url.includes("/status")) return false;
        send(res, 200, { buildID: BUILD_ID, templateID: TEMPLATE_ID, status: "paused", logs: [], logEntries: [] });
        return true;
      };
      return build(
        client,
        template(client, (t) => t.fromImage("x")),
        "odd",
      );
    });
    expect(ours.result).toEqual(theirs.result);
    expect(ours.result).toEqual({ error: { name: "BuildError", message: "Unknown build error occurred." } });
  });

  const refusals: [string, (call: RecordedCall) => boolean, number, unknown][] = [
    ["create refused (400)", (c) => c.url === "/v3/templates", 400, { code: 400, message: "Invalid name: 'A B'" }],
    ["create unauthorized (401)", (c) => c.url === "/v3/templates", 401, { code: 401, message: "Invalid API key" }],
    ["create rate-limited (429)", (c) => c.url === "/v3/templates", 429, { code: 429, message: "too many builds" }],
    ["no builder (503)", (c) => c.url === "/v3/templates", 503, { code: 503, message: "no builder" }],
    ["files link of an unknown template (404)", (c) => c.url.includes("/files/"), 404, { code: 404, message: "nope" }],
    ["the upload fails (500)", (c) => c.method === "PUT", 500, undefined],
    ["trigger refused (400)", (c) => c.url.startsWith("/v2/templates"), 400, { code: 400, message: "not waiting" }],
    [
      "status of an unknown build (400)",
      (c) => c.url.includes("/status"),
      400,
      { code: 400, message: "Build 'x' not found" },
    ],
    ["an error body that is not JSON (500)", (c) => c.url === "/v3/templates", 500, "plain text"],
  ];
  for (const [name, when, status, body] of refusals) {
    test(`${name}: the same error class and message`, async () => {
      const { ours, theirs } = await runBoth(async (client) => {
        api.override = (call, res) => {
          if (!when(call)) return false;
          if (typeof body === "string") res.writeHead(status, { "Content-Type": "text/plain" }).end(body);
          else send(res, status, body);
          return true;
        };
        return build(
          client,
          template(client, (t) => t.fromImage("x").copy("hello.txt", "/h")),
          "refused",
          {
            retries: 0,
          },
        );
      });
      expect(ours.result).toEqual(theirs.result);
      expect(ours.calls.map((c) => c.url)).toEqual(theirs.calls.map((c) => c.url));
    });
  }

  test("no API key: AuthenticationError before any request; no name: TemplateError", async () => {
    const t = warren.Template({ fileContextPath: ctx }).fromImage("x");
    const saved = { w: process.env.WARREN_API_KEY, e: process.env.E2B_API_KEY };
    delete process.env.WARREN_API_KEY;
    delete process.env.E2B_API_KEY;
    try {
      await expect(warren.Template.build(t, "n", { apiUrl: api.url })).rejects.toBeInstanceOf(
        warren.AuthenticationError,
      );
      expect(api.calls).toEqual([]);
      await expect(warren.Template.build(t, "", opts())).rejects.toThrow(
        new warren.TemplateError("Name must be provided"),
      );
      await expect(warren.Template.build(t, { ...opts(), alias: "legacy" })).resolves.toMatchObject({ name: "legacy" });
    } finally {
      if (saved.w !== undefined) process.env.WARREN_API_KEY = saved.w;
      if (saved.e !== undefined) process.env.E2B_API_KEY = saved.e;
    }
  });

  test("a relative upload URL is resolved against the API URL (Warren extra)", async () => {
    api.override = (call, res) => {
      const m = /^\/templates\/[^/]+\/files\/([0-9a-f]{64})$/.exec(call.url);
      if (!m) return false;
      send(res, 201, { present: false, url: `/upload/${m[1]}` });
      return true;
    };
    await warren.Template.build(
      template("warren", (t) => t.fromImage("x").copy("hello.txt", "/h")),
      "rel",
      opts(),
    );
    expect(api.uploads.size).toBe(1);
  });
});

describe("status, names and tags, side by side with e2b", () => {
  test("getBuildStatus: log entries with Date timestamps and ANSI stripped", async () => {
    const { ours, theirs } = await runBoth(async (client) => {
      const lib = client === "warren" ? warren.Template : (e2b.Template as unknown as typeof warren.Template);
      const status = await lib.getBuildStatus(
        { templateId: TEMPLATE_ID, buildId: BUILD_ID },
        { ...opts(), logsOffset: 1 },
      );
      return {
        ...status,
        logEntries: status.logEntries.map((e) => ({
          t: e.timestamp.toISOString(),
          level: e.level,
          message: e.message,
        })),
      };
    });
    expect(ours).toEqual(theirs);
    expect(ours.calls[0]?.url).toBe(`/templates/${TEMPLATE_ID}/builds/${BUILD_ID}/status?logsOffset=1`);
  });

  const lookups: [string, number, unknown, boolean][] = [
    ["found (200)", 200, { templateID: TEMPLATE_ID, public: false }, true],
    ["another team's (403)", 403, { code: 403, message: "forbidden" }, true],
    ["unknown (404)", 404, { code: 404, message: "not found" }, false],
  ];
  for (const [name, status, body, expected] of lookups) {
    test(`exists: ${name}`, async () => {
      const { ours, theirs } = await runBoth(async (client) => {
        api.override = (_call, res) => {
          send(res, status, body);
          return true;
        };
        const lib = client === "warren" ? warren.Template : (e2b.Template as unknown as typeof warren.Template);
        return [await lib.exists("acme/name:v1", opts()), await lib.aliasExists("name", opts())];
      });
      expect(ours).toEqual(theirs);
      expect(ours.result).toEqual({ ok: [expected, expected] });
      expect(ours.calls[0]?.url).toBe("/templates/aliases/acme%2Fname%3Av1");
    });
  }

  test("exists: another status is a TemplateError with statusCode", async () => {
    api.override = (_call, res) => {
      send(res, 400, { code: 400, message: "namespace 'x' must match your team 'acme'" });
      return true;
    };
    const error = await warren.Template.exists("x/y", opts()).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(warren.TemplateError);
    expect(error).toMatchObject({ statusCode: 400, message: "400: namespace 'x' must match your team 'acme'" });
  });

  test("assignTags, removeTags, getTags", async () => {
    const { ours, theirs } = await runBoth(async (client) => {
      api.override = (call, res) => {
        if (call.method === "POST") send(res, 201, { buildID: BUILD_ID, tags: ["prod", "stable"] });
        else if (call.method === "DELETE") send(res, 204);
        else send(res, 200, [{ tag: "default", buildID: BUILD_ID, createdAt: "2026-01-01T10:00:00Z" }]);
        return true;
      };
      const lib = client === "warren" ? warren.Template : (e2b.Template as unknown as typeof warren.Template);
      const assigned = await lib.assignTags("name:v1", ["prod", "stable"], opts());
      const single = await lib.assignTags("name:v1", "prod", opts());
      await lib.removeTags("name", "prod", opts());
      const tags = await lib.getTags("acme/name", opts());
      return { assigned, single, tags: tags.map((t) => ({ ...t, createdAt: t.createdAt.toISOString() })) };
    });
    expect(ours).toEqual(theirs);
    expect(ours.calls.map((c) => `${c.method} ${c.url} ${JSON.stringify(c.body ?? null)}`)).toEqual([
      'POST /templates/tags {"target":"name:v1","tags":["prod","stable"]}',
      'POST /templates/tags {"target":"name:v1","tags":["prod"]}',
      'DELETE /templates/tags {"name":"name","tags":["prod"]}',
      "GET /templates/acme%2Fname/tags null",
    ]);
  });

  test("tag calls refused: TemplateError with the status", async () => {
    const { ours, theirs } = await runBoth(async (client) => {
      api.override = (_call, res) => {
        send(res, 404, { code: 404, message: "tag 'x' does not exist for template 'y'" });
        return true;
      };
      const lib = client === "warren" ? warren.Template : (e2b.Template as unknown as typeof warren.Template);
      return lib.getTags("y", opts());
    });
    expect(ours.result).toEqual(theirs.result);
    expect(ours.result).toEqual({
      error: { name: "TemplateError", message: "404: tag 'x' does not exist for template 'y'" },
    });
  });
});

describe("Warren's listing, detail and delete", () => {
  test("list, getInfo and delete map E2B's schemas", async () => {
    const listed = {
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
      createdBy: null,
    };
    api.override = (call, res) => {
      if (call.method === "GET" && call.url === "/templates") send(res, 200, [listed]);
      else if (call.method === "GET")
        send(res, 200, {
          ...listed,
          builds: [
            {
              buildID: BUILD_ID,
              status: "ready",
              createdAt: listed.createdAt,
              updatedAt: listed.updatedAt,
              cpuCount: 2,
              memoryMB: 1024,
            },
          ],
        });
      else if (call.url.endsWith("gone")) send(res, 404, { code: 404, message: "not found" });
      else send(res, 204);
      return true;
    };
    const [info] = await warren.Template.list(opts());
    expect(info).toMatchObject({ templateId: TEMPLATE_ID, names: ["acme/myname"], lastSpawnedAt: null, buildCount: 1 });
    expect(info?.createdAt).toEqual(new Date(listed.createdAt));
    const detail = await warren.Template.getInfo("acme/myname", opts());
    expect(detail.builds).toEqual([
      expect.objectContaining({
        buildId: BUILD_ID,
        status: "ready",
        cpuCount: 2,
        createdAt: new Date(listed.createdAt),
      }),
    ]);
    expect(await warren.Template.delete("myname", opts())).toBe(true);
    expect(await warren.Template.delete("gone", opts())).toBe(false);
    expect(api.calls.map((c) => `${c.method} ${c.url}`)).toEqual([
      "GET /templates",
      "GET /templates/acme%2Fmyname",
      "DELETE /templates/myname",
      "DELETE /templates/gone",
    ]);
  });
});

describe("template files (the CLI's --template-file)", () => {
  test("toJSON's document parses back into the same template", async () => {
    const t = template("warren", sample);
    const json = await warren.Template.toJSON(t);
    const restored = warren.templateFromJSON(json, { fileContextPath: ctx });
    expect(JSON.parse(json).readyCmd).toBe('[ -n "$(ss -Htuln sport = :8000)" ]');
    expect(await warren.Template.toJSON(restored)).toBe(json);
  });

  test("a hand-written file: defaults filled, filesHash recomputed", async () => {
    const text = JSON.stringify({
      fromTemplate: "base",
      steps: [
        { type: "run", args: ["echo hi > /tmp/x"] },
        { type: "COPY", args: ["hello.txt", "/home/user/"], filesHash: "stale" },
      ],
    });
    const doc = JSON.parse(await warren.Template.toJSON(warren.templateFromJSON(text, { fileContextPath: ctx })));
    expect(doc).toEqual({
      steps: [
        { type: "RUN", args: ["echo hi > /tmp/x"], force: false },
        {
          type: "COPY",
          args: ["hello.txt", "/home/user/", "", ""],
          force: false,
          filesHash: expect.stringMatching(/^[0-9a-f]{64}$/),
        },
      ],
      force: false,
      fromTemplate: "base",
    });
  });

  const invalid: [string, unknown, RegExp][] = [
    ["not an object", [], /must be a JSON object/],
    ["both bases", { fromImage: "a", fromTemplate: "b" }, /exactly one of fromImage and fromTemplate/],
    ["no base", { steps: [] }, /exactly one of fromImage and fromTemplate/],
    ["an unknown step type", { fromImage: "a", steps: [{ type: "HEALTHCHECK", args: [] }] }, /steps\[0\]\.type/],
    [
      "args not strings",
      { fromImage: "a", steps: [{ type: "RUN", args: [1] }] },
      /steps\[0\]\.args must be an array of strings/,
    ],
    [
      "a WORKDIR with two paths",
      { fromImage: "a", steps: [{ type: "WORKDIR", args: ["/a", "/b"] }] },
      /takes 1 values, got 2/,
    ],
    ["an odd ENV", { fromImage: "a", steps: [{ type: "ENV", args: ["K", "v", "K2"] }] }, /key, value pairs/],
    ["a bad mode", { fromImage: "a", steps: [{ type: "COPY", args: ["a.txt", "/a", "", "rwx"] }] }, /mode/],
    ["a COPY from outside", { fromImage: "a", steps: [{ type: "COPY", args: ["../x", "/a"] }] }, /escapes the context/],
    ["a bad registry", { fromImage: "a", fromImageRegistry: { type: "ftp" } }, /fromImageRegistry.type/],
  ];
  for (const [name, doc, message] of invalid) {
    test(`rejects ${name}`, () => {
      expect(() => warren.templateFromJSON(JSON.stringify(doc), { fileContextPath: ctx })).toThrow(message);
    });
  }

  test("rejects text that is not JSON", () => {
    const dir = mkdtempSync(join(tmpdir(), "warren-tplfile-"));
    writeFileSync(join(dir, "t.json"), "{");
    expect(() => warren.templateFromJSON("{", { fileContextPath: dir })).toThrow(warren.InvalidArgumentError);
  });
});
