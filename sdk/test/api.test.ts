import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import {
  AuthenticationError,
  InvalidArgumentError,
  NotFoundError,
  RateLimitError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  ServiceBusyError,
} from "../src/index.js";
import { json, type RecordingServer, startRecordingServer } from "./harness.js";

let api: RecordingServer;
const SANDBOX = {
  sandboxID: "isbx1",
  templateID: "base",
  clientID: "6532622b",
  envdVersion: "0.6.4",
  envdAccessToken: "tok",
  domain: null,
};
const DETAIL = {
  ...SANDBOX,
  alias: "base",
  startedAt: "2026-01-01T00:00:00Z",
  endAt: "2026-01-01T00:05:00Z",
  state: "running",
  cpuCount: 2,
  memoryMB: 512,
  diskSizeMB: 1024,
  metadata: { a: "b" },
};

beforeAll(async () => {
  api = await startRecordingServer();
});
afterEach(() => {
  api.requests.length = 0;
});
afterAll(async () => {
  await api?.close();
});

const opts = () => ({ apiKey: "key-1", apiUrl: api.url, sandboxUrl: "http://127.0.0.1:9" });

describe("REST request shaping (against a recording server; end-to-end waits for the api)", () => {
  test("create sends POST /v2/sandboxes with E2B's body, X-API-KEY and an Idempotency-Key", async () => {
    api.handle((_req, res) => json(res, 201, SANDBOX));
    const sandbox = await Sandbox.create("code-interpreter-v1", {
      ...opts(),
      metadata: { a: "b" },
      envs: { FOO: "bar" },
      timeoutMs: 119_001,
      network: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
      lifecycle: { onTimeout: "pause", autoResume: true },
    });
    expect(sandbox.sandboxId).toBe("isbx1");
    const [req] = api.requests;
    expect(req?.method).toBe("POST");
    expect(req?.url).toBe("/v2/sandboxes");
    expect(req?.headers["x-api-key"]).toBe("key-1");
    expect(req?.headers["content-type"]).toBe("application/json");
    expect(req?.headers["idempotency-key"]).toMatch(/^[0-9a-f-]{36}$/);
    expect(JSON.parse(req?.body ?? "")).toEqual({
      templateID: "code-interpreter-v1",
      metadata: { a: "b" },
      envVars: { FOO: "bar" },
      timeout: 120,
      network: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
      autoPause: true,
      autoResume: { enabled: true },
    });
  });

  test("create retried after 503, 502 and a dropped connection reuses the same Idempotency-Key", async () => {
    let calls = 0;
    api.handle((_req, res) => {
      calls++;
      if (calls === 1) return json(res, 503, { code: 503, message: "busy" });
      if (calls === 2) return json(res, 502, { code: 502, message: "bad gateway" });
      if (calls === 3) return void res.socket?.destroy();
      json(res, 201, SANDBOX);
    });
    await Sandbox.create({ ...opts(), retries: 3 });
    expect(api.requests).toHaveLength(4);
    const keys = new Set(api.requests.map((r) => r.headers["idempotency-key"]));
    expect(keys.size).toBe(1);
    expect([...keys][0]).toBeTruthy();
  });

  test("a caller-chosen idempotencyKey is sent as is; two creates get different generated keys", async () => {
    api.handle((_req, res) => json(res, 201, SANDBOX));
    await Sandbox.create({ ...opts(), idempotencyKey: "my-key-1" });
    await Sandbox.create(opts());
    await Sandbox.create(opts());
    expect(api.requests[0]?.headers["idempotency-key"]).toBe("my-key-1");
    expect(api.requests[1]?.headers["idempotency-key"]).not.toBe(api.requests[2]?.headers["idempotency-key"]);
  });

  test("a non-idempotent call is never repeated after a 503: kill is sent once and throws ServiceBusyError", async () => {
    api.handle((_req, res) => json(res, 503, { code: 503, message: "busy" }));
    await expect(Sandbox.kill("isbx1", opts())).rejects.toBeInstanceOf(ServiceBusyError);
    expect(api.requests).toHaveLength(1);
  });

  test("429 with Retry-After is retried; without it RateLimitError is thrown", async () => {
    let calls = 0;
    api.handle((_req, res) => {
      calls++;
      if (calls === 1) return json(res, 429, { code: 429, message: "slow" }, { "Retry-After": "0" });
      json(res, 200, DETAIL);
    });
    await Sandbox.getInfo("isbx1", opts());
    expect(api.requests).toHaveLength(2);
    api.handle((_req, res) => json(res, 429, { code: 429, message: "slow down" }));
    await expect(Sandbox.getInfo("isbx1", opts())).rejects.toBeInstanceOf(RateLimitError);
  });

  test("connect sends POST /v2/sandboxes/{id}/connect with the timeout; 404 is SandboxNotFoundError", async () => {
    api.handle((_req, res) => json(res, 200, SANDBOX));
    const sandbox = await Sandbox.connect("isbx1", { ...opts(), timeoutMs: 60_000 });
    expect(sandbox.sandboxId).toBe("isbx1");
    expect(api.requests[0]?.url).toBe("/v2/sandboxes/isbx1/connect");
    expect(JSON.parse(api.requests[0]?.body ?? "")).toEqual({ timeout: 60 });
    await sandbox.connect();
    expect(JSON.parse(api.requests[1]?.body ?? "")).toEqual({});
    api.handle((_req, res) => json(res, 404, { code: 404, message: "not found" }));
    await expect(Sandbox.connect("gone", opts())).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(Sandbox.connect("x", { ...opts(), onResume: "nope" as "reboot" })).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
  });

  test("getInfo maps SandboxDetail to SandboxInfo; 404 is SandboxNotFoundError", async () => {
    api.handle((_req, res) => json(res, 200, DETAIL));
    const info = await Sandbox.getInfo("isbx1", opts());
    expect(api.requests[0]?.url).toBe("/sandboxes/isbx1");
    expect(info).toMatchObject({ sandboxId: "isbx1", templateId: "base", name: "base", state: "running" });
    expect(info.startedAt).toEqual(new Date("2026-01-01T00:00:00Z"));
    api.handle((_req, res) => json(res, 404, { code: 404, message: "nope" }));
    await expect(Sandbox.getInfo("gone", opts())).rejects.toBeInstanceOf(SandboxNotFoundError);
  });

  test("kill is DELETE /sandboxes/{id}: 204 → true, 404 → false", async () => {
    api.handle((_req, res) => void res.writeHead(204).end());
    expect(await Sandbox.kill("isbx1", opts())).toBe(true);
    expect(api.requests[0]).toMatchObject({ method: "DELETE", url: "/sandboxes/isbx1" });
    api.handle((_req, res) => json(res, 404, { code: 404, message: "nope" }));
    expect(await Sandbox.kill("gone", opts())).toBe(false);
  });

  test("setTimeout posts the timeout in whole seconds; pause posts memory and treats 409 as false", async () => {
    api.handle((_req, res) => void res.writeHead(204).end());
    await Sandbox.setTimeout("isbx1", 29_500, opts());
    expect(api.requests[0]).toMatchObject({ method: "POST", url: "/sandboxes/isbx1/timeout", body: '{"timeout":30}' });
    expect(await Sandbox.pause("isbx1", { ...opts(), keepMemory: false })).toBe(true);
    expect(api.requests[1]).toMatchObject({ url: "/sandboxes/isbx1/pause", body: '{"memory":false}' });
    api.handle((_req, res) => json(res, 409, { code: 409, message: "already paused" }));
    expect(await Sandbox.pause("isbx1", opts())).toBe(false);
  });

  test("list pages with X-Next-Token and encodes the metadata filter the way E2B does", async () => {
    let page = 0;
    api.handle((_req, res) => {
      page++;
      json(res, 200, [DETAIL], page === 1 ? { "X-Next-Token": "n2" } : {});
    });
    const paginator = Sandbox.list({
      ...opts(),
      query: { metadata: { a: "b c", "k&": "v=" }, state: ["running", "paused"] },
      limit: 1,
    });
    expect((await paginator.nextItems()).map((s) => s.sandboxId)).toEqual(["isbx1"]);
    expect(paginator.hasNext).toBe(true);
    await paginator.nextItems();
    expect(paginator.hasNext).toBe(false);
    const first = new URL(api.requests[0]?.url ?? "", api.url);
    expect(first.pathname).toBe("/v2/sandboxes");
    expect(api.requests[0]?.url).toContain("metadata=a%3Db%252520c%26k%252526%3Dv%25253D");
    expect(first.searchParams.get("state")).toBe("running,paused");
    expect(first.searchParams.get("limit")).toBe("1");
    expect(new URL(api.requests[1]?.url ?? "", api.url).searchParams.get("nextToken")).toBe("n2");
    await expect(paginator.nextItems()).rejects.toBeInstanceOf(SandboxError);
  });

  test("401 is AuthenticationError; no API key fails before any request", async () => {
    api.handle((_req, res) => json(res, 401, { code: 401, message: "bad key" }));
    await expect(Sandbox.getInfo("isbx1", opts())).rejects.toBeInstanceOf(AuthenticationError);
    const before = api.requests.length;
    const saved = { w: process.env.WARREN_API_KEY, e: process.env.E2B_API_KEY };
    delete process.env.WARREN_API_KEY;
    delete process.env.E2B_API_KEY;
    try {
      await expect(Sandbox.getInfo("isbx1", { apiUrl: api.url })).rejects.toBeInstanceOf(AuthenticationError);
    } finally {
      if (saved.w !== undefined) process.env.WARREN_API_KEY = saved.w;
      if (saved.e !== undefined) process.env.E2B_API_KEY = saved.e;
    }
    expect(api.requests.length).toBe(before);
  });

  test("create and connect called on a subclass return an instance of that subclass", async () => {
    class CodeSandbox extends Sandbox {
      static override readonly defaultTemplate = "code-interpreter-v1";
    }
    api.handle((_req, res) => json(res, 201, SANDBOX));
    const sandbox = await CodeSandbox.create(opts());
    expect(sandbox).toBeInstanceOf(CodeSandbox);
    expect(JSON.parse(api.requests[0]?.body ?? "").templateID).toBe("code-interpreter-v1");
    expect(await CodeSandbox.connect("isbx1", opts())).toBeInstanceOf(CodeSandbox);
  });

  test("lifecycle options are validated client-side", async () => {
    await expect(
      Sandbox.create({ ...opts(), lifecycle: { onTimeout: "kill", autoResume: true } }),
    ).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(api.requests).toHaveLength(0);
  });
});

describe("snapshot and fork request shaping (against a recording server)", () => {
  test("createSnapshot posts the name and reads Warren's memory and sizeBytes; 404 is SandboxNotFoundError", async () => {
    api.handle((_req, res) =>
      json(res, 201, { snapshotID: "t/s1:default", names: ["t/s1:default"], memory: true, sizeBytes: 4096 }),
    );
    const sandbox = new Sandbox({ ...opts(), sandboxId: "isbx1", envdVersion: "0.6.4" });
    expect(await sandbox.createSnapshot({ name: "s1" })).toEqual({
      snapshotId: "t/s1:default",
      names: ["t/s1:default"],
      memory: true,
      sizeBytes: 4096,
    });
    expect(api.requests[0]).toMatchObject({ method: "POST", url: "/sandboxes/isbx1/snapshots", body: '{"name":"s1"}' });
    await Sandbox.createSnapshot("isbx1", opts());
    expect(api.requests[1]?.body).toBe("{}");
    api.handle((_req, res) => json(res, 404, { code: 404, message: "sandbox not found" }));
    await expect(Sandbox.createSnapshot("gone", opts())).rejects.toBeInstanceOf(SandboxNotFoundError);
  });

  test("listSnapshots pages with X-Next-Token and filters by sandbox and name; an instance lists its own", async () => {
    const row = { snapshotID: "s2:default", names: [], sandboxID: "isbx1", createdAt: "2026-01-01T00:00:00Z" };
    let page = 0;
    api.handle((_req, res) => {
      page++;
      json(res, 200, [{ ...row, memory: false, sizeBytes: 10 }], page === 1 ? { "X-Next-Token": "n2" } : {});
    });
    const paginator = Sandbox.listSnapshots({ ...opts(), name: "s2", limit: 1 });
    expect(await paginator.nextItems()).toEqual([
      {
        snapshotId: "s2:default",
        names: [],
        sandboxId: "isbx1",
        createdAt: new Date(row.createdAt),
        memory: false,
        sizeBytes: 10,
      },
    ]);
    expect(paginator.hasNext).toBe(true);
    await paginator.nextItems();
    expect(paginator.hasNext).toBe(false);
    await expect(paginator.nextItems()).rejects.toBeInstanceOf(SandboxError);
    const first = new URL(api.requests[0]?.url ?? "", api.url);
    expect(first.pathname).toBe("/snapshots");
    expect(Object.fromEntries(first.searchParams)).toEqual({ name: "s2", limit: "1" });
    expect(new URL(api.requests[1]?.url ?? "", api.url).searchParams.get("nextToken")).toBe("n2");

    const sandbox = new Sandbox({ ...opts(), sandboxId: "isbx9", envdVersion: "0.6.4" });
    await sandbox.listSnapshots().nextItems();
    expect(new URL(api.requests[2]?.url ?? "", api.url).searchParams.get("sandboxID")).toBe("isbx9");
  });

  test("deleteSnapshot is DELETE /templates/{id}: 204 → true, 404 → false", async () => {
    api.handle((_req, res) => void res.writeHead(204).end());
    expect(await Sandbox.deleteSnapshot("team/s1:default", opts())).toBe(true);
    expect(api.requests[0]).toMatchObject({ method: "DELETE", url: "/templates/team%2Fs1%3Adefault" });
    api.handle((_req, res) => json(res, 404, { code: 404, message: "snapshot not found" }));
    expect(await Sandbox.deleteSnapshot("nope:default", opts())).toBe(false);
  });

  test("fork: one entry per fork, a Sandbox or its error mapped like other API errors", async () => {
    api.handle((_req, res) =>
      json(res, 201, [
        { sandbox: { ...SANDBOX, sandboxID: "fork1" } },
        { error: { code: 429, message: "too many sandboxes" } },
        { error: { code: 404, message: "snapshot gone" } },
        { error: { code: 500, message: "boom" } },
      ]),
    );
    class CodeSandbox extends Sandbox {}
    const source = new CodeSandbox({ ...opts(), sandboxId: "isbx1", envdVersion: "0.6.4" });
    const [ok, limited, missing, failed] = await source.fork({ count: 4, timeoutMs: 59_001 });
    expect(api.requests[0]).toMatchObject({ method: "POST", url: "/sandboxes/isbx1/fork" });
    expect(JSON.parse(api.requests[0]?.body ?? "")).toEqual({ count: 4, timeout: 60 });
    expect(ok).toBeInstanceOf(CodeSandbox);
    expect((ok as Sandbox).sandboxId).toBe("fork1");
    expect((ok as Sandbox).connectionConfig.sandboxUrl).toBe("http://127.0.0.1:9");
    expect(limited).toBeInstanceOf(RateLimitError);
    expect(missing).toBeInstanceOf(NotFoundError);
    expect(missing).not.toBeInstanceOf(SandboxNotFoundError);
    expect(failed).toBeInstanceOf(SandboxError);
    expect((failed as SandboxError).statusCode).toBe(500);

    api.handle((_req, res) => json(res, 404, { code: 404, message: "sandbox 'gone' not found" }));
    await expect(Sandbox.fork("gone", opts())).rejects.toThrow(SandboxNotFoundError);
  });
});
