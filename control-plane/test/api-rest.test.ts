import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey, SHIPPED_BUILDS_TEAM } from "../src/store/teams.js";
import { eventually, TestEnv } from "./api-harness.js";

/** The REST surface over plain HTTP: validation, E2B error bodies, status codes, tenancy, quotas, admin. */
describe("api REST surface", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;
  let keyA: string;
  let keyB: string;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
    ({ apiKey: keyA } = await env.team("a"));
    ({ apiKey: keyB } = await env.team("b"));
  });
  afterAll(() => env.stop());

  const create = (apiKey: string, body: unknown = { templateID: "base" }, headers: Record<string, string> = {}) =>
    env.request("POST", "/v2/sandboxes", { apiKey, body, headers });

  it("answers a missing or unknown API key with 401 and E2B's error body", async () => {
    const missing = await env.request("GET", "/v2/sandboxes");
    expect(missing.status).toBe(401);
    expect(missing.body).toMatchObject({ code: 401, message: expect.any(String) });
    const wrong = await env.request("GET", "/v2/sandboxes", { apiKey: "e2b_nope" });
    expect(wrong.status).toBe(401);
    expect(wrong.body).toEqual({ code: 401, message: "Invalid API key" });
  });

  it.each([
    [{ timeout: 10 }, "templateID is required"],
    [{ templateID: "base", timeout: 0 }, "Timeout must be greater than 0"],
    [{ templateID: "base", timeout: -5 }, "Timeout must be greater than 0"],
    [{ templateID: "base", timeout: 1.5 }, "timeout must be a 32-bit integer"],
    [{ templateID: "base", timeout: 25 * 3600 }, "Timeout cannot be greater than 24 hours"],
    [{ templateID: "base", metadata: { a: 1 } }, "metadata.a must be a string"],
    [{ templateID: "base", envVars: "x" }, "envVars must be an object of strings"],
    [{ templateID: "base", autoPauseMemory: false }, "autoPauseMemory=false only applies when autoPause is true."],
    [
      { templateID: "base", autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } },
      "autoPauseMemory=false (filesystem-only auto-pause) cannot be combined with autoResume",
    ],
    [
      { templateID: "base", network: { allowOut: ["example.com"] } },
      "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out",
    ],
    [{ templateID: "base", network: { denyOut: ["not-an-ip"] } }, "network.denyOut entry 'not-an-ip'"],
    [{ templateID: "bad template!" }, "is not a valid template reference"],
  ])("refuses create body %j with 400: %s", async (body, message) => {
    const res = await create(keyA, body);
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ code: 400 });
    expect((res.body as { message: string }).message).toContain(message);
  });

  it("refuses what no store accepts with 400 naming the field: NUL, deep nesting, bad env names, dates, forged cursors", async () => {
    // Written as text: JSON.stringify itself overflows the stack at this depth.
    const deep = `${'{"d":'.repeat(5000)}"x"${"}".repeat(5000)}`;
    const forged = (at: string, id: string) => Buffer.from(JSON.stringify([at, id])).toString("base64url");
    const cases: [Promise<{ status: number; body: unknown }>, string][] = [
      [create(keyA, { templateID: "base", metadata: { k: "a\u0000b" } }), "body.metadata.k contains a NUL character"],
      [create(keyA, { templateID: "base", envVars: { A: "x\u0000" } }), "body.envVars.A contains a NUL character"],
      [create(keyA, { templateID: "base", metadata: { "k\u0000": "v" } }), "has a key with a NUL character"],
      [create(keyA, `{"templateID":"base","metadata":${deep}}`), "nested deeper than 32 levels"],
      [create(keyA, `{"templateID":"base","unknown":${deep}}`), "nested deeper than 32 levels"],
      [create(keyA, { templateID: "base", envVars: { "": "x" } }), "'' is not a valid variable name"],
      [create(keyA, { templateID: "base", envVars: { "A=B": "x" } }), "'A=B' is not a valid variable name"],
      [env.request("GET", "/v2/sandboxes?startedAfter=-100000-01-01T00:00:00Z", { apiKey: keyA }), "startedAfter"],
      [env.request("GET", "/v2/sandboxes?template=%00", { apiKey: keyA }), "query.template contains a NUL character"],
      [
        env.request("GET", `/v2/sandboxes?nextToken=${forged("+300000-01-01T00:00:00.000Z", "i1")}`, { apiKey: keyA }),
        "nextToken is invalid",
      ],
      [
        env.request("GET", `/v2/sandboxes?nextToken=${forged("2026-01-01T00:00:00.000Z", "i\u0000")}`, {
          apiKey: keyA,
        }),
        "nextToken is invalid",
      ],
      [
        env.request("GET", `/v2/sandboxes?metadata=${encodeURIComponent(encodeURIComponent("k=%00"))}`, {
          apiKey: keyA,
        }),
        "metadata filter contains a NUL character",
      ],
    ];
    for (const [request, message] of cases) {
      const res = await request;
      expect(res.status, message).toBe(400);
      expect((res.body as { message: string }).message).toContain(message);
    }
    // Nothing was admitted: team A has no sandbox left from these.
    const rows = await env.db.query(
      "SELECT count(*)::int AS n FROM sandboxes WHERE team_id = (SELECT team_id FROM api_keys WHERE key_hash = $1)",
      [hashApiKey(keyA)],
    );
    const live = await env.request("GET", "/v2/sandboxes", { apiKey: keyA });
    expect(live.status).toBe(200);
    expect(rows.rows[0]?.n).toBe((live.body as unknown[]).length);
  });

  it("refuses a body that is not JSON with a 400 error body", async () => {
    const res = await env.request("POST", "/v2/sandboxes", { apiKey: keyA, body: "{nope" });
    expect(res.status).toBe(400);
    expect(res.body).toEqual({ code: 400, message: "request body is not valid JSON" });
  });

  it("answers an unknown template with 404", async () => {
    const res = await create(keyA, { templateID: "no-such-template" });
    expect(res.status).toBe(404);
    expect(res.body).toMatchObject({ code: 404, message: "template 'no-such-template' not found" });
  });

  it("creates with v1 POST /sandboxes (default timeout 15 s) and connects with v1 connect (timeout required)", async () => {
    const res = await env.request("POST", "/sandboxes", { apiKey: keyA, body: { templateID: "base", secure: true } });
    expect(res.status).toBe(201);
    const sandbox = res.body as Record<string, unknown>;
    expect(sandbox).toMatchObject({ templateID: "base", clientID: "6532622b", envdVersion: "0.6.4", domain: null });
    expect(typeof sandbox.envdAccessToken).toBe("string");
    const info = await env.request("GET", `/sandboxes/${sandbox.sandboxID}`, { apiKey: keyA });
    const { startedAt, endAt } = info.body as { startedAt: string; endAt: string };
    expect(Date.parse(endAt) - Date.parse(startedAt)).toBeLessThan(20_000);
    // Warren's extra nodeID names the node it runs on, in the detail and in the list alike.
    expect(info.body).toMatchObject({ nodeID: "node-a" });
    const noTimeout = await env.request("POST", `/sandboxes/${sandbox.sandboxID}/connect`, { apiKey: keyA, body: {} });
    expect(noTimeout.status).toBe(400);
    const connected = await env.request("POST", `/sandboxes/${sandbox.sandboxID}/connect`, {
      apiKey: keyA,
      body: { timeout: 60 },
    });
    expect(connected.status).toBe(200);
    expect((connected.body as Record<string, unknown>).envdAccessToken).toBe(sandbox.envdAccessToken);
    const v1list = await env.request("GET", "/sandboxes", { apiKey: keyA });
    const v1listed = (v1list.body as { sandboxID: string; nodeID: string }[]).find(
      (s) => s.sandboxID === sandbox.sandboxID,
    );
    expect(v1listed).toMatchObject({ nodeID: "node-a" });
    await env.request("DELETE", `/sandboxes/${sandbox.sandboxID}`, { apiKey: keyA });
  });

  it("answers empty successes with 204 and no body (kill, timeout, refreshes, pause)", async () => {
    const { sandboxID } = (await create(keyA)).body as { sandboxID: string };
    const timeout = await env.request("POST", `/sandboxes/${sandboxID}/timeout`, {
      apiKey: keyA,
      body: { timeout: 30 },
    });
    expect([timeout.status, timeout.text]).toEqual([204, ""]);
    const refresh = await env.request("POST", `/sandboxes/${sandboxID}/refreshes`, {
      apiKey: keyA,
      body: { duration: 10 },
    });
    expect([refresh.status, refresh.text]).toEqual([204, ""]);
    const pause = await env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey: keyA, body: {} });
    expect([pause.status, pause.text]).toEqual([204, ""]);
    const again = await env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey: keyA, body: {} });
    expect(again.status).toBe(409);
    expect(again.body).toMatchObject({ code: 409 });
    const resume = await env.request("POST", `/sandboxes/${sandboxID}/resume`, { apiKey: keyA, body: { timeout: 60 } });
    expect(resume.status).toBe(201);
    const resumeRunning = await env.request("POST", `/sandboxes/${sandboxID}/resume`, { apiKey: keyA, body: {} });
    expect(resumeRunning.status).toBe(409);
    const kill = await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyA });
    expect([kill.status, kill.text]).toEqual([204, ""]);
    const killAgain = await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyA });
    expect(killAgain.status).toBe(404);
    expect(killAgain.body).toEqual({
      code: 404,
      message: `Sandbox "${sandboxID}" doesn't exist or you don't have access to it`,
    });
  });

  it("connect on a paused sandbox resumes it with 201 and the same envd access token", async () => {
    const created = (await create(keyA)).body as { sandboxID: string; envdAccessToken: string };
    await env.request("POST", `/sandboxes/${created.sandboxID}/pause`, { apiKey: keyA, body: { memory: true } });
    const res = await env.request("POST", `/v2/sandboxes/${created.sandboxID}/connect`, { apiKey: keyA, body: {} });
    expect(res.status).toBe(201);
    expect((res.body as { envdAccessToken: string }).envdAccessToken).toBe(created.envdAccessToken);
    await env.request("DELETE", `/sandboxes/${created.sandboxID}`, { apiKey: keyA });
  });

  it("never shows team A's sandbox to team B: every path answers 404, not 403", async () => {
    const { sandboxID } = (await create(keyA, { templateID: "base", metadata: { owner: "a" } })).body as {
      sandboxID: string;
    };
    const attempts = await Promise.all([
      env.request("GET", `/sandboxes/${sandboxID}`, { apiKey: keyB }),
      env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyB }),
      env.request("POST", `/v2/sandboxes/${sandboxID}/connect`, { apiKey: keyB, body: {} }),
      env.request("POST", `/sandboxes/${sandboxID}/timeout`, { apiKey: keyB, body: { timeout: 5 } }),
      env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey: keyB, body: {} }),
      env.request("GET", `/sandboxes/${sandboxID}/metrics`, { apiKey: keyB }),
      env.request("GET", `/v2/sandboxes/${sandboxID}/logs`, { apiKey: keyB }),
      env.request("GET", `/warren/v1/sandboxes/${sandboxID}/events`, { apiKey: keyB }),
    ]);
    for (const res of attempts) {
      expect(res.status).toBe(404);
      expect(res.body).toMatchObject({ code: 404 });
    }
    const listB = await env.request("GET", "/v2/sandboxes", { apiKey: keyB });
    expect(listB.body).toEqual([]);
    const infoA = await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey: keyA });
    expect(infoA.status).toBe(200);
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyA });
  });

  it("validates list queries with 400s", async () => {
    for (const query of [
      "state=dead",
      "limit=0",
      "limit=101",
      "order=sideways",
      "nextToken=garbage",
      "startedAfter=x",
    ]) {
      const res = await env.request("GET", `/v2/sandboxes?${query}`, { apiKey: keyA });
      expect(res.status, query).toBe(400);
      expect(res.body).toMatchObject({ code: 400 });
    }
  });

  it("filters the list by template, startedAfter, and reports X-Total-Running", async () => {
    const before = new Date(Date.now() - 1000).toISOString();
    const { sandboxID } = (await create(keyA, { templateID: "base", metadata: { f: "t" } })).body as {
      sandboxID: string;
    };
    const byTemplate = await env.request("GET", "/v2/sandboxes?template=base&metadata=f%253Dt", { apiKey: keyA });
    expect((byTemplate.body as { sandboxID: string }[]).map((s) => s.sandboxID)).toEqual([sandboxID]);
    expect(byTemplate.headers.get("x-total-running")).toBe("1");
    expect(byTemplate.headers.get("x-next-token")).toBeNull();
    const unknown = await env.request("GET", "/v2/sandboxes?template=nothing", { apiKey: keyA });
    expect([unknown.status, unknown.body]).toEqual([200, []]);
    const future = await env.request(
      "GET",
      `/v2/sandboxes?startedAfter=${new Date(Date.now() + 60_000).toISOString()}`,
      {
        apiKey: keyA,
      },
    );
    expect(future.body).toEqual([]);
    const since = await env.request("GET", `/v2/sandboxes?startedAfter=${encodeURIComponent(before)}`, {
      apiKey: keyA,
    });
    expect((since.body as { sandboxID: string }[]).map((s) => s.sandboxID)).toContain(sandboxID);
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyA });
  });

  it("serves lifecycle logs (v1 and v2) and metrics endpoints for a visible sandbox", async () => {
    const { sandboxID } = (await create(keyA)).body as { sandboxID: string };
    const v2 = await env.request("GET", `/v2/sandboxes/${sandboxID}/logs`, { apiKey: keyA });
    expect(v2.status).toBe(200);
    const logs = (v2.body as { logs: { message: string; level: string }[] }).logs;
    expect(logs.map((l) => l.message)).toEqual([
      "sandbox.created: - -> starting",
      "sandbox.started: starting -> running",
    ]);
    const v1 = await env.request("GET", `/sandboxes/${sandboxID}/logs`, { apiKey: keyA });
    expect((v1.body as { logs: unknown[]; logEntries: unknown[] }).logEntries).toHaveLength(2);
    // The node's lines (envd) join the lifecycle events, in time order, and the query filters both.
    const startedAt = Date.parse((logs as unknown as { timestamp: string }[])[1]?.timestamp ?? "");
    env.nodes.get("node-a")?.logLines.set(sandboxID, [
      { timestampMs: startedAt + 5, level: "info", message: "process started", fields: { pid: "7" } },
      { timestampMs: startedAt + 10, level: "error", message: "process failed", fields: {} },
    ]);
    const merged = (await env.request("GET", `/v2/sandboxes/${sandboxID}/logs`, { apiKey: keyA })).body as {
      logs: { message: string; level: string; fields: Record<string, string> }[];
    };
    expect(merged.logs.map((l) => [l.fields.source, l.message])).toEqual([
      ["lifecycle", "sandbox.created: - -> starting"],
      ["lifecycle", "sandbox.started: starting -> running"],
      ["envd", "process started"],
      ["envd", "process failed"],
    ]);
    const query = async (q: string) =>
      (
        (await env.request("GET", `/v2/sandboxes/${sandboxID}/logs${q}`, { apiKey: keyA })).body as {
          logs: { message: string }[];
        }
      ).logs.map((l) => l.message);
    expect(await query("?level=error")).toEqual(["process failed"]);
    expect(await query("?search=STARTED")).toEqual(["sandbox.started: starting -> running", "process started"]);
    expect(await query("?direction=backward&limit=2")).toEqual(["process failed", "process started"]);
    expect(await query(`?cursor=${startedAt + 6}`)).toEqual(["process failed"]);
    expect(await query(`?cursor=${startedAt + 6}&direction=backward&limit=1`)).toEqual(["process started"]);
    for (const q of ["?limit=0", "?cursor=soon", "?direction=up", "?level=loud"]) {
      expect((await env.request("GET", `/v2/sandboxes/${sandboxID}/logs${q}`, { apiKey: keyA })).status, q).toBe(400);
    }
    const v1start = (await env.request("GET", `/sandboxes/${sandboxID}/logs?start=${startedAt + 6}`, { apiKey: keyA }))
      .body as { logs: { line: string }[] };
    expect(v1start.logs.map((l) => l.line)).toEqual(["process failed"]);
    const metrics = await env.request("GET", `/sandboxes/${sandboxID}/metrics`, { apiKey: keyA });
    expect(metrics.status).toBe(200);
    const sample = {
      cpuCount: 1,
      cpuUsedPct: 0,
      memUsed: 10 * 2 ** 20,
      memTotal: 512 * 2 ** 20,
      memCache: 0,
      diskUsed: 2 ** 20,
      diskTotal: 2 ** 30,
    };
    expect(metrics.body).toEqual([expect.objectContaining(sample)]);
    const [first] = metrics.body as { timestamp: string; timestampUnix: number }[];
    expect(Math.abs((first?.timestampUnix ?? 0) * 1000 - Date.now())).toBeLessThan(60_000);
    expect(new Date(first?.timestamp ?? "").getTime()).toBeGreaterThan(0);
    // Every sample is stored: the next request sees the first one and a new one, oldest first.
    const series = (await env.request("GET", `/sandboxes/${sandboxID}/metrics`, { apiKey: keyA })).body as {
      timestampUnix: number;
      timestamp: string;
    }[];
    expect(series).toHaveLength(2);
    expect(series[0]?.timestamp).toBe(first?.timestamp);
    expect(Date.parse(series[1]?.timestamp ?? "")).toBeGreaterThanOrEqual(Date.parse(series[0]?.timestamp ?? ""));
    // A range that ends before the sandbox existed holds no sample.
    const before = await env.request("GET", `/sandboxes/${sandboxID}/metrics?start=1&end=2`, { apiKey: keyA });
    expect([before.status, before.body]).toEqual([200, []]);
    const bad = await env.request("GET", `/sandboxes/${sandboxID}/metrics?start=soon`, { apiKey: keyA });
    expect(bad.status).toBe(400);
    const many = await env.request("GET", `/sandboxes/metrics?sandbox_ids=${sandboxID},nosuchsandbox`, {
      apiKey: keyA,
    });
    expect(many.status).toBe(200);
    expect(many.body).toEqual({ sandboxes: { [sandboxID]: expect.objectContaining(sample) } });
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyA });
  });

  it("PUT /sandboxes/{id}/network replaces the egress policy on the node, then in the store", async () => {
    const created = await create(keyA, { templateID: "base", allow_internet_access: false });
    const { sandboxID } = created.body as { sandboxID: string };
    const node = env.nodes.get("node-a");
    const onCreate = node?.created.find((r) => r.sandboxId === sandboxID);
    expect(onCreate?.egress).toEqual({ allowOut: [], denyOut: ["0.0.0.0/0"] });
    const path = `/sandboxes/${sandboxID}/network`;
    const update = { allowOut: ["1.1.1.1", "*.example.com"], denyOut: ["0.0.0.0/0"] };
    const put = await env.request("PUT", path, { apiKey: keyA, body: update });
    expect(put.status).toBe(204);
    expect(node?.egress.get(sandboxID)?.at(-1)).toEqual(update);
    const detail = await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey: keyA });
    expect(detail.body).toMatchObject({ network: update, egress: update });
    // Bad input: 400 naming the problem, nothing changed on the node.
    for (const [body, message] of [
      [{ allowOut: ["example.com"] }, "you must include 'ALL_TRAFFIC' in deny out"],
      [{ denyOut: ["example.com"] }, "network.denyOut entry 'example.com' is not an IP address or CIDR"],
      [{ allowOut: "1.1.1.1" }, "allowOut must be an array of strings"],
      [{ rules: { "example.com": [{}] } }, "network.rules (HTTP header transforms on egress) is not supported"],
      [{ egressProxy: { address: "p:1080" } }, "egressProxy (SOCKS5 egress) is not supported"],
      [{ allow_internet_access: "yes" }, "allow_internet_access must be a boolean"],
    ] as const) {
      const res = await env.request("PUT", path, { apiKey: keyA, body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect((res.body as { message: string }).message).toContain(message);
    }
    expect(node?.egress.get(sandboxID)).toHaveLength(1);
    // Another team's sandbox is not found, as is an unknown one.
    expect((await env.request("PUT", path, { apiKey: keyB, body: {} })).status).toBe(404);
    expect((await env.request("PUT", "/sandboxes/nosuchsandbox/network", { apiKey: keyA, body: {} })).status).toBe(404);
    // The node fails to apply it: an error, and the stored policy stays what the node enforces.
    if (node) node.failEgressUpdates = true;
    const failed = await env.request("PUT", path, { apiKey: keyA, body: {} });
    if (node) node.failEgressUpdates = false;
    expect(failed.status).toBeGreaterThanOrEqual(500);
    expect((await env.request("GET", `/sandboxes/${sandboxID}`, { apiKey: keyA })).body).toMatchObject({
      egress: update,
    });
    // allow_internet_access alone: false closes everything, true (with nothing else) opens it.
    expect((await env.request("PUT", path, { apiKey: keyA, body: { allow_internet_access: true } })).status).toBe(204);
    expect(node?.egress.get(sandboxID)?.at(-1)).toEqual({ allowOut: [], denyOut: [] });
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey: keyA });
    expect((await env.request("PUT", path, { apiKey: keyA, body: {} })).status).toBe(404);
  });

  it("a team's egress mode: closed by default, or forbidden (403 when a request asks for egress)", async () => {
    const { apiKey: closedKey } = await env.team("closed", { egressMode: "closed" });
    const closed = await create(closedKey, { templateID: "base" });
    const closedId = (closed.body as { sandboxID: string }).sandboxID;
    const node = env.nodes.get("node-a");
    expect(node?.created.find((r) => r.sandboxId === closedId)?.egress).toEqual({
      allowOut: [],
      denyOut: ["0.0.0.0/0"],
    });
    const opened = await create(closedKey, { templateID: "base", allow_internet_access: true });
    const openedId = (opened.body as { sandboxID: string }).sandboxID;
    expect(node?.created.find((r) => r.sandboxId === openedId)?.egress).toEqual({ allowOut: [], denyOut: [] });
    const { apiKey: forbiddenKey } = await env.team("forbidden", { egressMode: "forbidden" });
    for (const body of [
      { templateID: "base", allow_internet_access: true },
      { templateID: "base", network: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] } },
    ]) {
      const res = await create(forbiddenKey, body);
      expect(res.status).toBe(403);
      expect(res.body).toMatchObject({ code: 403, message: expect.stringContaining("forbids network egress") });
    }
    const ok = await create(forbiddenKey, { templateID: "base", network: { denyOut: ["8.8.8.8"] } });
    expect(ok.status).toBe(201);
    const okId = (ok.body as { sandboxID: string }).sandboxID;
    expect(node?.created.find((r) => r.sandboxId === okId)?.egress).toEqual({ allowOut: [], denyOut: ["0.0.0.0/0"] });
    for (const id of [closedId, openedId, okId]) {
      await env.request("DELETE", `/sandboxes/${id}`, { apiKey: id === okId ? forbiddenKey : closedKey });
    }
  });

  it("answers an unknown path with a 404 error body", async () => {
    const res = await env.request("GET", "/v9/nothing", { apiKey: keyA });
    expect(res.status).toBe(404);
    expect(res.body).toMatchObject({ code: 404 });
  });

  it("Idempotency-Key: a retried create returns the same sandbox, another body with the key is refused", async () => {
    const headers = { "Idempotency-Key": `idem-${Date.now()}` };
    const body = { templateID: "base", metadata: { idem: "1" } };
    const [first, second] = await Promise.all([create(keyA, body, headers), create(keyA, body, headers)]);
    expect(first.status).toBe(201);
    expect(second.status).toBe(201);
    const a = first.body as { sandboxID: string; envdAccessToken: string };
    const b = second.body as { sandboxID: string; envdAccessToken: string };
    expect(b.sandboxID).toBe(a.sandboxID);
    expect(b.envdAccessToken).toBe(a.envdAccessToken);
    const third = await create(keyA, body, headers);
    expect((third.body as { sandboxID: string }).sandboxID).toBe(a.sandboxID);
    expect(third.headers.get("idempotent-replayed")).toBe("true");
    const listed = await env.request("GET", "/v2/sandboxes?metadata=idem%253D1", { apiKey: keyA });
    expect(listed.body).toHaveLength(1);
    const other = await create(keyA, { templateID: "base" }, headers);
    expect(other.status).toBe(400);
    // The same key in another team is another sandbox.
    const teamB = await create(keyB, body, headers);
    expect((teamB.body as { sandboxID: string }).sandboxID).not.toBe(a.sandboxID);
    await env.request("DELETE", `/sandboxes/${a.sandboxID}`, { apiKey: keyA });
    await env.request("DELETE", `/sandboxes/${(teamB.body as { sandboxID: string }).sandboxID}`, { apiKey: keyB });
  });

  it("admin path creates teams and keys; keys are shown once and stored only as SHA-256", async () => {
    const denied = await env.request("POST", "/warren/v1/admin/teams", { body: { name: "x" } });
    expect(denied.status).toBe(401);
    const res = await env.request("POST", "/warren/v1/admin/teams", {
      body: { name: "admin-made", maxConcurrentSandboxes: 3 },
      headers: { "X-Admin-Token": env.adminToken },
    });
    expect(res.status).toBe(201);
    const { team, apiKey } = res.body as { team: { id: string }; apiKey: { id: string; key: string } };
    expect(apiKey.key).toMatch(/^e2b_[0-9a-f]{40}$/);
    const stored = await env.db.query("SELECT * FROM api_keys WHERE id = $1", [apiKey.id]);
    expect(stored.rows[0].key_hash).toBe(hashApiKey(apiKey.key));
    expect(JSON.stringify(stored.rows[0])).not.toContain(apiKey.key);
    const teams = await env.request("GET", "/warren/v1/admin/teams", { headers: { "X-Admin-Token": env.adminToken } });
    expect(teams.body).toEqual(expect.arrayContaining([expect.objectContaining({ id: team.id, name: "admin-made" })]));
    expect(teams.text).not.toContain(apiKey.key);
    const works = await env.request("GET", "/v2/sandboxes", { apiKey: apiKey.key });
    expect(works.status).toBe(200);
    const second = await env.request("POST", `/warren/v1/admin/teams/${team.id}/api-keys`, {
      body: {},
      headers: { "X-Admin-Token": env.adminToken },
    });
    expect(second.status).toBe(201);
    const secondKey = second.body as { id: string; key: string };
    // Used once first: the api keeps a known key's identity (WARREN_API_KEY_CACHE_MS), and its own revocation
    // must still apply to the very next request.
    expect((await env.request("GET", "/v2/sandboxes", { apiKey: secondKey.key })).status).toBe(200);
    const revoke = await env.request("DELETE", `/warren/v1/admin/api-keys/${secondKey.id}`, {
      headers: { "X-Admin-Token": env.adminToken },
    });
    expect(revoke.status).toBe(204);
    const revoked = await env.request("GET", "/v2/sandboxes", { apiKey: secondKey.key });
    expect(revoked.status).toBe(401);
    const nodes = await eventually(async () => {
      const res = await env.request("GET", "/warren/v1/admin/nodes", { headers: { "X-Admin-Token": env.adminToken } });
      return (res.body as unknown[]).length > 0 ? res.body : undefined;
    }, "reconciled nodes");
    expect(nodes).toEqual([expect.objectContaining({ id: "node-a", state: "up" })]);
  });

  it("the shipped builds' team is reserved: in no list, and the admin API neither changes it nor makes it a key", async () => {
    const admin = { "X-Admin-Token": env.adminToken };
    // As the master makes it for its first shipped build (master/templates/shipped-builds.ts).
    await env.db.query("INSERT INTO teams (id, name) VALUES ($1, $1) ON CONFLICT (id) DO NOTHING", [
      SHIPPED_BUILDS_TEAM,
    ]);
    const teams = await env.request("GET", "/warren/v1/admin/teams", { headers: admin });
    expect(teams.status).toBe(200);
    expect((teams.body as { id: string }[]).map((t) => t.id)).not.toContain(SHIPPED_BUILDS_TEAM);
    const path = `/warren/v1/admin/teams/${SHIPPED_BUILDS_TEAM}`;
    const key = await env.request("POST", `${path}/api-keys`, { body: {}, headers: admin });
    expect(key.status).toBe(404);
    expect(key.text).toContain(`team '${SHIPPED_BUILDS_TEAM}' not found`);
    expect((await env.request("GET", `${path}/api-keys`, { headers: admin })).status).toBe(404);
    expect((await env.request("PATCH", path, { body: { maxConcurrentSandboxes: 1 }, headers: admin })).status).toBe(
      404,
    );
    const keys = await env.db.query("SELECT count(*)::int AS n FROM api_keys WHERE team_id = $1", [
      SHIPPED_BUILDS_TEAM,
    ]);
    expect(keys.rows[0].n).toBe(0);
  });

  it("admin lists a team's API keys with prefix, created and revoked, never the key or its hash", async () => {
    const admin = { "X-Admin-Token": env.adminToken };
    const made = await env.request("POST", "/warren/v1/admin/teams", { body: { name: "keys-listed" }, headers: admin });
    const { team, apiKey: first } = made.body as { team: { id: string }; apiKey: { id: string; key: string } };
    const second = (
      await env.request("POST", `/warren/v1/admin/teams/${team.id}/api-keys`, {
        body: { name: "ci", approver: true },
        headers: admin,
      })
    ).body as { id: string; key: string };
    const denied = await env.request("GET", `/warren/v1/admin/teams/${team.id}/api-keys`);
    expect(denied.status).toBe(401);
    const asTeam = await env.request("GET", `/warren/v1/admin/teams/${team.id}/api-keys`, { apiKey: first.key });
    expect(asTeam.status).toBe(401);
    expect((await env.request("DELETE", `/warren/v1/admin/api-keys/${first.id}`, { headers: admin })).status).toBe(204);

    const listed = await env.request("GET", `/warren/v1/admin/teams/${team.id}/api-keys`, { headers: admin });
    expect(listed.status).toBe(200);
    const keys = listed.body as Array<Record<string, unknown>>;
    expect(keys.map((k) => k.id)).toEqual([first.id, second.id]);
    expect(keys[0]).toMatchObject({ name: "default", prefix: first.key.slice(0, 10), approver: false });
    expect(keys[0]?.revokedAt).toEqual(expect.stringMatching(/^\d{4}-\d\d-\d\dT/));
    expect(keys[1]).toMatchObject({ name: "ci", prefix: second.key.slice(0, 10), revokedAt: null, approver: true });
    expect(Date.parse(keys[1]?.createdAt as string)).toBeGreaterThan(Date.now() - 60_000);
    for (const k of keys)
      expect(Object.keys(k).sort()).toEqual(["approver", "createdAt", "id", "name", "prefix", "revokedAt"]);
    for (const secret of [first.key, second.key, hashApiKey(first.key), hashApiKey(second.key)]) {
      expect(listed.text).not.toContain(secret);
    }
    const unknown = await env.request("GET", "/warren/v1/admin/teams/team_nope/api-keys", { headers: admin });
    expect(unknown.status).toBe(404);
    expect(unknown.body).toMatchObject({ message: "team 'team_nope' not found" });
  });

  it("serves its OpenAPI document covering E2B paths and Warren extras", async () => {
    const res = await env.request("GET", "/openapi.json");
    expect(res.status).toBe(200);
    const doc = res.body as { openapi: string; paths: Record<string, unknown> };
    expect(doc.openapi).toBe("3.1.0");
    for (const path of [
      "/v3/templates",
      "/templates/{templateID}/files/{hash}",
      "/v2/templates/{templateID}/builds/{buildID}",
      "/templates/{templateID}/builds/{buildID}/status",
      "/templates/aliases/{alias}",
      "/templates/tags",
      "/templates/{templateID}/tags",
      "/templates/{templateID}",
      "/volumes",
      "/volumes/{volumeID}",
      "/volumecontent/{volumeID}/file",
      "/secrets",
      "/secrets/{secretID}",
      "/v2/sandboxes",
      "/sandboxes",
      "/v2/sandboxes/{sandboxID}/connect",
      "/sandboxes/{sandboxID}/connect",
      "/sandboxes/{sandboxID}",
      "/sandboxes/{sandboxID}/timeout",
      "/sandboxes/{sandboxID}/refreshes",
      "/sandboxes/{sandboxID}/pause",
      "/sandboxes/{sandboxID}/metrics",
      "/sandboxes/metrics",
      "/v2/sandboxes/{sandboxID}/logs",
      "/warren/v1/sandboxes/{sandboxID}/events/stream",
      "/warren/v1/admin/teams",
      "/warren/v1/admin/teams/{teamID}/api-keys",
    ]) {
      expect(doc.paths, path).toHaveProperty([path]);
    }
  });

  it("exposes Prometheus metrics counting requests by route and status", async () => {
    const res = await env.request("GET", "/metrics");
    expect(res.status).toBe(200);
    expect(res.text).toContain('warren_api_requests_total{method="POST",route="/v2/sandboxes",status="201"}');
    expect(res.text).toContain("warren_api_sandbox_creates_total");
  });
});
