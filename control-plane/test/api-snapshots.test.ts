import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually, type FakeNodeAgent, TestEnv } from "./api-harness.js";

/**
 * Snapshots and forks through the REST api and the master, with fake node agents (the real capture is tested
 * against real sandboxes in e2e/test/snapshots.test.ts): E2B's ids and names, list filters and pages, deletion,
 * create from a snapshot only on its node with its resources and env, the memory-snapshot token hand-over, fork
 * outcomes one by one, and that a failed capture records nothing.
 */
describe("api snapshots and fork", () => {
  const env = new TestEnv();
  env.checkAnswersAgainstDocument = true;
  let keyA: string;
  let keyB: string;
  let nodeA: FakeNodeAgent;
  let nodeB: FakeNodeAgent;

  beforeAll(async () => {
    await env.start();
    nodeA = await env.addNode("node-a");
    ({ apiKey: keyA } = await env.team("Acme Labs", { maxConcurrentSandboxes: 100, maxCreatesPerMinute: 1000 }));
    ({ apiKey: keyB } = await env.team("b"));
  });
  afterAll(() => env.stop());

  const create = async (apiKey: string, body: Record<string, unknown> = { templateID: "base" }) => {
    const res = await env.request("POST", "/v2/sandboxes", { apiKey, body });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    return res.body as { sandboxID: string; envdAccessToken: string; templateID: string };
  };
  /** The fake node running a sandbox. */
  const nodeOf = (sandboxID: string): FakeNodeAgent => {
    const node = [...env.nodes.values()].find((n) => n.sandboxes.has(sandboxID));
    if (!node) throw new Error(`no node has ${sandboxID}`);
    return node;
  };
  const snapshot = (apiKey: string, sandboxID: string, body: unknown = {}) =>
    env.request("POST", `/sandboxes/${sandboxID}/snapshots`, { apiKey, body });

  it("createSnapshot answers E2B's SnapshotInfo: namespaced name when named, the id otherwise", async () => {
    const source = await create(keyA, { templateID: "base", envVars: { FROM: "source" }, metadata: { k: "v" } });
    const unnamed = await snapshot(keyA, source.sandboxID);
    expect(unnamed.status).toBe(201);
    expect(unnamed.body).toMatchObject({ snapshotID: expect.stringMatching(/^s[0-9a-f]{20}:default$/), names: [] });
    const named = await snapshot(keyA, source.sandboxID, { name: "my-snap" });
    expect(named.status).toBe(201);
    expect(named.body).toMatchObject({ snapshotID: "acme-labs/my-snap:default", names: ["acme-labs/my-snap:default"] });
    expect((named.body as { memory: boolean }).memory).toBe(false);
    // The source runs on, untouched.
    const info = await env.request("GET", `/sandboxes/${source.sandboxID}`, { apiKey: keyA });
    expect(info.body).toMatchObject({ state: "running" });
  });

  it("refuses bad names with 400, unknown and other teams' sandboxes with 404", async () => {
    const source = await create(keyA);
    for (const name of ["Upper", "has space", "-lead", "x".repeat(64), 5]) {
      const res = await snapshot(keyA, source.sandboxID, { name });
      expect(res.status, String(name)).toBe(400);
      expect((res.body as { message: string }).message).toContain("name must be");
    }
    expect((await snapshot(keyA, "nosuchsandbox")).status).toBe(404);
    expect((await snapshot(keyB, source.sandboxID)).status).toBe(404);
  });

  it("a failed capture records nothing and leaves the sandbox running", async () => {
    const source = await create(keyA);
    nodeA.failSnapshots = true;
    try {
      const res = await snapshot(keyA, source.sandboxID, { name: "never" });
      expect(res.status).toBe(503);
      expect((res.body as { message: string }).message).toContain("copying the writable layer failed");
    } finally {
      nodeA.failSnapshots = false;
    }
    const listed = await env.request("GET", "/snapshots?name=never", { apiKey: keyA });
    expect(listed.body).toEqual([]);
    const info = await env.request("GET", `/sandboxes/${source.sandboxID}`, { apiKey: keyA });
    expect(info.body).toMatchObject({ state: "running" });
  });

  it("creates from a snapshot (any form of its id) on its node only, with its resources and env vars", async () => {
    const source = await create(keyA, { templateID: "base", envVars: { FROM: "source", KEEP: "1" } });
    const made = (await snapshot(keyA, source.sandboxID, { name: "env-snap" })).body as { snapshotID: string };
    nodeB = await env.addNode("node-b");
    for (const ref of ["env-snap", "env-snap:default", "acme-labs/env-snap:default", made.snapshotID]) {
      const sandbox = await create(keyA, { templateID: ref, envVars: { FROM: "request" } });
      const request = nodeA.created.find((r) => r.sandboxId === sandbox.sandboxID);
      expect(request, ref).toBeDefined();
      expect(request?.snapshotId).toMatch(/^s[0-9a-f]{20}$/);
      expect(request?.templateId).toBe("base");
      expect(request?.envVars).toEqual({ FROM: "request", KEEP: "1" });
      // A files-only snapshot boots a fresh envd: no token hand-over.
      expect(request?.snapshotEnvdAccessToken).toBeUndefined();
      expect(nodeB.created.some((r) => r.sandboxId === sandbox.sandboxID)).toBe(false);
    }
    // Another team's namespace, another tag, or another team entirely: not found.
    for (const ref of ["other/env-snap:default", "env-snap:v2"]) {
      const res = await env.request("POST", "/v2/sandboxes", { apiKey: keyA, body: { templateID: ref } });
      expect(res.status, ref).toBe(404);
    }
    const foreign = await env.request("POST", "/v2/sandboxes", { apiKey: keyB, body: { templateID: "env-snap" } });
    expect(foreign.status).toBe(404);
  });

  it("a snapshot whose node is gone answers 503 and creates nothing", async () => {
    const lonely = await env.addNode("node-c");
    nodeA.refuse = true;
    nodeB.refuse = true;
    const source = await create(keyA);
    nodeA.refuse = false;
    nodeB.refuse = false;
    expect(lonely.sandboxes.has(source.sandboxID)).toBe(true);
    await snapshot(keyA, source.sandboxID, { name: "on-c" });
    await env.stopHeartbeat("node-c");
    const before = nodeA.created.length + nodeB.created.length;
    const res = await env.request("POST", "/v2/sandboxes", { apiKey: keyA, body: { templateID: "on-c" } });
    expect(res.status).toBe(503);
    expect((res.body as { message: string }).message).toContain("node-c");
    expect(nodeA.created.length + nodeB.created.length).toBe(before);
  });

  it("a memory snapshot hands the source's envd token to the node, so /init can set the new one", async () => {
    nodeA.snapshotsKeepMemory = true;
    try {
      nodeB.refuse = true;
      const source = await create(keyA);
      nodeB.refuse = false;
      const made = await snapshot(keyA, source.sandboxID, { name: "with-memory" });
      expect((made.body as { memory: boolean }).memory).toBe(true);
      const sandbox = await create(keyA, { templateID: "with-memory" });
      const request = nodeA.created.find((r) => r.sandboxId === sandbox.sandboxID);
      expect(request?.snapshotEnvdAccessToken).toBe(source.envdAccessToken);
      expect(request?.envdAccessToken).toBe(sandbox.envdAccessToken);
      expect(sandbox.envdAccessToken).not.toBe(source.envdAccessToken);
    } finally {
      nodeA.snapshotsKeepMemory = false;
    }
  });

  it("lists the team's snapshots newest first, by sandbox and by name, in pages; never another team's", async () => {
    const source = await create(keyA);
    const refs: string[] = [];
    for (const name of ["page-1", "page-2", "page-3"]) {
      refs.push(((await snapshot(keyA, source.sandboxID, { name })).body as { snapshotID: string }).snapshotID);
    }
    const bySandbox = await env.request("GET", `/snapshots?sandboxID=${source.sandboxID}`, { apiKey: keyA });
    expect((bySandbox.body as { snapshotID: string }[]).map((s) => s.snapshotID)).toEqual([...refs].reverse());
    const first = await env.request("GET", `/snapshots?sandboxID=${source.sandboxID}&limit=2`, { apiKey: keyA });
    expect((first.body as unknown[]).length).toBe(2);
    const token = first.headers.get("x-next-token");
    expect(token).toBeTruthy();
    const second = await env.request(
      "GET",
      `/snapshots?sandboxID=${source.sandboxID}&limit=2&nextToken=${encodeURIComponent(token ?? "")}`,
      { apiKey: keyA },
    );
    expect((second.body as { snapshotID: string }[]).map((s) => s.snapshotID)).toEqual([refs[0]]);
    expect(second.headers.get("x-next-token")).toBeNull();
    for (const name of ["page-2", "page-2:default", "acme-labs/page-2"]) {
      const byName = await env.request("GET", `/snapshots?name=${encodeURIComponent(name)}`, { apiKey: keyA });
      expect(
        (byName.body as { snapshotID: string }[]).map((s) => s.snapshotID),
        name,
      ).toEqual([refs[1]]);
    }
    const all = await env.request("GET", "/snapshots", { apiKey: keyA });
    expect((all.body as unknown[]).length).toBeGreaterThanOrEqual(5);
    const other = await env.request("GET", "/snapshots", { apiKey: keyB });
    expect(other.body).toEqual([]);
    const bad = await env.request("GET", "/snapshots?nextToken=garbage", { apiKey: keyA });
    expect(bad.status).toBe(400);
  });

  it("a name used again moves to the new snapshot; the old one's files are deleted on its node", async () => {
    const source = await create(keyA);
    const node = nodeOf(source.sandboxID);
    await snapshot(keyA, source.sandboxID, { name: "moving" });
    const firstId = [...node.snapshots.values()].at(-1)?.snapshotId;
    await snapshot(keyA, source.sandboxID, { name: "moving" });
    expect(node.deletedSnapshots).toContain(firstId);
    const listed = await env.request("GET", "/snapshots?name=moving", { apiKey: keyA });
    expect((listed.body as unknown[]).length).toBe(1);
  });

  it("DELETE /templates/{id} deletes a snapshot (204, files gone, no longer a template); 404 after or if foreign", async () => {
    const source = await create(keyA);
    const made = (await snapshot(keyA, source.sandboxID, { name: "doomed" })).body as { snapshotID: string };
    const user = await create(keyA, { templateID: "doomed" });
    expect((await env.request("DELETE", "/templates/doomed", { apiKey: keyB })).status).toBe(404);
    const res = await env.request("DELETE", `/templates/${encodeURIComponent(made.snapshotID)}`, { apiKey: keyA });
    expect(res.status).toBe(204);
    expect((await env.request("DELETE", "/templates/doomed", { apiKey: keyA })).status).toBe(404);
    expect((await env.request("POST", "/v2/sandboxes", { apiKey: keyA, body: { templateID: "doomed" } })).status).toBe(
      404,
    );
    // The sandbox made from it is not touched.
    const info = await env.request("GET", `/sandboxes/${user.sandboxID}`, { apiKey: keyA });
    expect(info.body).toMatchObject({ state: "running" });
    // A built-in template cannot be deleted this way.
    expect((await env.request("DELETE", "/templates/base", { apiKey: keyA })).status).toBe(404);
  });

  it("fork: count forks from one capture, each a sandbox or its own error; the capture is removed after", async () => {
    const source = await create(keyA, { templateID: "base", envVars: { SECRET: "s" }, metadata: { owner: "me" } });
    const node = nodeOf(source.sandboxID);
    // Durable captures (`d…`) of paused sandboxes by the leader's pass may come and go meanwhile: not the fork's.
    const forkCopies = () => [...node.snapshots.keys()].filter((id) => !id.startsWith("d")).length;
    const snapshotsBefore = forkCopies();
    const res = await env.request("POST", `/sandboxes/${source.sandboxID}/fork`, {
      apiKey: keyA,
      body: { count: 2, timeout: 60 },
    });
    expect(res.status).toBe(201);
    const results = res.body as { sandbox?: { sandboxID: string; envdAccessToken: string } }[];
    expect(results).toHaveLength(2);
    const ids = results.map((r) => r.sandbox?.sandboxID);
    expect(new Set(ids).size).toBe(2);
    for (const r of results) {
      const request = node.created.find((c) => c.sandboxId === r.sandbox?.sandboxID);
      expect(request?.snapshotId).toMatch(/^f[0-9a-f]{20}$/);
      expect(request?.envVars).toEqual({ SECRET: "s" });
      expect(request?.metadata).toEqual({ owner: "me" });
      const info = await env.request("GET", `/sandboxes/${r.sandbox?.sandboxID}`, { apiKey: keyA });
      const endAt = Date.parse((info.body as { endAt: string }).endAt);
      expect(endAt - Date.now()).toBeGreaterThan(30_000);
      expect(endAt - Date.now()).toBeLessThanOrEqual(60_000);
    }
    // The fork's capture is not a listed snapshot and its files are released on the node.
    expect(forkCopies()).toBe(snapshotsBefore);
    const listed = await env.request("GET", `/snapshots?sandboxID=${source.sandboxID}`, { apiKey: keyA });
    expect(listed.body).toEqual([]);
    const info = await env.request("GET", `/sandboxes/${source.sandboxID}`, { apiKey: keyA });
    expect(info.body).toMatchObject({ state: "running" });
  });

  it("fork: quota applies per fork (429 entries), bad bodies are 400, unknown sources 404", async () => {
    const { apiKey } = await env.team("small", { maxConcurrentSandboxes: 2 });
    const source = await create(apiKey);
    const res = await env.request("POST", `/sandboxes/${source.sandboxID}/fork`, { apiKey, body: { count: 3 } });
    expect(res.status).toBe(201);
    const results = res.body as { sandbox?: unknown; error?: { code: number; message: string } }[];
    expect(results.filter((r) => r.sandbox)).toHaveLength(1);
    expect(results.filter((r) => r.error?.code === 429)).toHaveLength(2);
    expect(results.find((r) => r.error)?.error?.message).toContain("maximum number of concurrent sandboxes");
    for (const body of [{ count: 0 }, { count: 21 }, { count: 1.5 }, { timeout: -1 }, { count: "2" }]) {
      const bad = await env.request("POST", `/sandboxes/${source.sandboxID}/fork`, { apiKey, body });
      expect(bad.status, JSON.stringify(body)).toBe(400);
    }
    const missing = await env.request("POST", "/sandboxes/nosuchsandbox/fork", { apiKey, body: {} });
    expect(missing.status).toBe(404);
    expect((missing.body as { message: string }).message).toContain("nosuchsandbox");
  });

  it("the leader deletes node snapshot files no live row refers to (after a grace period)", async () => {
    // A snapshot the node has that PostgreSQL never recorded, made long enough ago.
    nodeA.snapshots.set("sorphan000000000000000", {
      snapshotId: "sorphan000000000000000",
      templateId: "base",
      driver: "namespace",
      memory: false,
      sizeBytes: 1,
      createdAt: new Date(Date.now() - 3600_000),
      sourceSandboxId: "gone",
    });
    nodeA.snapshots.set("sfresh0000000000000000", {
      snapshotId: "sfresh0000000000000000",
      templateId: "base",
      driver: "namespace",
      memory: false,
      sizeBytes: 1,
      createdAt: new Date(),
      sourceSandboxId: "gone",
    });
    await eventually(
      async () => (nodeA.deletedSnapshots.includes("sorphan000000000000000") ? true : undefined),
      "orphan snapshot deleted",
    );
    expect(nodeA.snapshots.has("sfresh0000000000000000")).toBe(true);
    // A fork's capture whose master stopped mid-fork (the row stays live): expired after the grace period.
    const { rows } = await env.db.query<{ id: string }>("SELECT id FROM teams ORDER BY created_at LIMIT 1");
    await env.db.query(
      `INSERT INTO snapshots (id, team_id, kind, source_sandbox_id, node_id, template_id, driver, memory, size_bytes,
         cpu_count, memory_mb, disk_size_mb, created_at)
       VALUES ('fstale000000000000000', $1, 'fork', 'gone', 'node-a', 'base', 'namespace', false, 1, 1, 512, 1024,
         now() - interval '1 hour')`,
      [rows[0]?.id],
    );
    nodeA.snapshots.set("fstale000000000000000", {
      snapshotId: "fstale000000000000000",
      templateId: "base",
      driver: "namespace",
      memory: false,
      sizeBytes: 1,
      createdAt: new Date(Date.now() - 3600_000),
      sourceSandboxId: "gone",
    });
    await eventually(
      async () => (nodeA.deletedSnapshots.includes("fstale000000000000000") ? true : undefined),
      "stale fork capture deleted",
    );
    // Live snapshots stay.
    const listed = (await env.request("GET", "/snapshots?name=page-1", { apiKey: keyA })).body as unknown[];
    expect(listed).toHaveLength(1);
  });

  describe("resume on another node (operator cordon)", () => {
    const admin = { "X-Admin-Token": env.adminToken };
    const cordon = async (nodeId: string, on: boolean) => {
      await eventually(async () => {
        const res = await env.request(on ? "POST" : "DELETE", `/warren/v1/admin/nodes/${nodeId}/cordon`, {
          headers: admin,
        });
        return res.status === 204 ? true : undefined;
      }, `cordon ${nodeId}`);
    };
    /** A sandbox on node-a (node-b refuses while it starts). */
    const onNodeA = async () => {
      nodeB.refuse = true;
      try {
        return await create(keyA, { templateID: "base", envVars: { KEPT: "yes" } });
      } finally {
        nodeB.refuse = false;
      }
    };

    it("refuses to cordon an unknown node with 404", async () => {
      const res = await env.request("POST", "/warren/v1/admin/nodes/nope/cordon", { headers: admin });
      expect(res.status).toBe(404);
    });

    it("a filesystem-only paused sandbox on a cordoned node resumes on another, with its id and tokens", async () => {
      const sbx = await onNodeA();
      expect(nodeOf(sbx.sandboxID)).toBe(nodeA);
      expect(
        (await env.request("POST", `/sandboxes/${sbx.sandboxID}/pause`, { apiKey: keyA, body: { memory: false } }))
          .status,
      ).toBe(204);
      await cordon("node-a", true);
      try {
        const res = await env.request("POST", `/v2/sandboxes/${sbx.sandboxID}/connect`, {
          apiKey: keyA,
          body: { timeout: 60 },
        });
        expect(res.status).toBe(201);
        expect((res.body as { envdAccessToken: string }).envdAccessToken).toBe(sbx.envdAccessToken);
        const target = nodeOf(sbx.sandboxID);
        expect(target).not.toBe(nodeA);
        const request = target.created.find((r) => r.sandboxId === sbx.sandboxID);
        expect(request?.snapshotId).toMatch(/^m[0-9a-f]{20}$/);
        expect(request?.envVars).toEqual({ KEPT: "yes" });
        expect(request?.envdAccessToken).toBe(sbx.envdAccessToken);
        // Gone from the old node, and the move's snapshot copies are deleted on both.
        expect(nodeA.sandboxes.has(sbx.sandboxID)).toBe(false);
        expect(nodeA.snapshots.has(request?.snapshotId ?? "")).toBe(false);
        expect(target.snapshots.has(request?.snapshotId ?? "")).toBe(false);
        const events = await env.request("GET", `/warren/v1/sandboxes/${sbx.sandboxID}/events`, { apiKey: keyA });
        const resumed = (events.body as { events: { type: string; data: Record<string, string> }[] }).events.find(
          (e) => e.type === "sandbox.resumed",
        );
        expect(resumed?.data).toMatchObject({ movedFrom: "node-a", node: target.nodeId });
        // Later operations go to the new node.
        expect((await env.request("DELETE", `/sandboxes/${sbx.sandboxID}`, { apiKey: keyA })).status).toBe(204);
        expect(target.killed).toContain(sbx.sandboxID);
      } finally {
        await cordon("node-a", false);
      }
    });

    it("a sandbox paused with its memory moves only with its memory (a node whose snapshots keep it)", async () => {
      nodeA.snapshotsKeepMemory = true;
      for (const node of env.nodes.values()) node.snapshotsKeepMemory = true;
      try {
        const sbx = await onNodeA();
        await env.request("POST", `/sandboxes/${sbx.sandboxID}/pause`, { apiKey: keyA, body: {} });
        await cordon("node-a", true);
        try {
          const res = await env.request("POST", `/v2/sandboxes/${sbx.sandboxID}/connect`, { apiKey: keyA, body: {} });
          expect(res.status).toBe(201);
          const target = nodeOf(sbx.sandboxID);
          expect(target).not.toBe(nodeA);
          const request = target.created.find((r) => r.sandboxId === sbx.sandboxID);
          // Its envd holds its own token already: presented and kept.
          expect(request?.snapshotEnvdAccessToken).toBe(sbx.envdAccessToken);
          expect(request?.envdAccessToken).toBe(sbx.envdAccessToken);
        } finally {
          await cordon("node-a", false);
        }
      } finally {
        for (const node of env.nodes.values()) node.snapshotsKeepMemory = false;
      }
    });

    it("a sandbox paused with its memory resumes where the memory is when its node cannot snapshot memory", async () => {
      const sbx = await onNodeA();
      await env.request("POST", `/sandboxes/${sbx.sandboxID}/pause`, { apiKey: keyA, body: {} });
      await cordon("node-a", true);
      try {
        const res = await env.request("POST", `/v2/sandboxes/${sbx.sandboxID}/connect`, { apiKey: keyA, body: {} });
        expect(res.status).toBe(201);
        expect(nodeOf(sbx.sandboxID)).toBe(nodeA);
        expect(nodeA.sandboxes.get(sbx.sandboxID)?.state).toBe("running");
      } finally {
        await cordon("node-a", false);
      }
    });

    it("a move that fails (import) resumes the sandbox on its own node and leaves no copies", async () => {
      const sbx = await onNodeA();
      await env.request("POST", `/sandboxes/${sbx.sandboxID}/pause`, { apiKey: keyA, body: { memory: false } });
      await cordon("node-a", true);
      for (const node of env.nodes.values()) node.failImports = true;
      try {
        // The leader's durability pass may capture the paused sandbox meanwhile (a `d…` snapshot): not a move's.
        const moveCopies = () => [...nodeA.snapshots.keys()].filter((id) => !id.startsWith("d")).length;
        const before = moveCopies();
        const res = await env.request("POST", `/v2/sandboxes/${sbx.sandboxID}/connect`, { apiKey: keyA, body: {} });
        expect(res.status).toBe(201);
        expect(nodeOf(sbx.sandboxID)).toBe(nodeA);
        expect(moveCopies()).toBe(before);
      } finally {
        for (const node of env.nodes.values()) node.failImports = false;
        await cordon("node-a", false);
      }
    });
  });
});
