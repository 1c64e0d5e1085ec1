import { randomBytes, randomUUID } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NodeAgentConnector } from "../src/master/node-agent-client.js";
import type { NodeRegistry } from "../src/master/node-registry.js";
import type { BuildBase } from "../src/master/templates/build-base.js";
import { BuildLog } from "../src/master/templates/build-log.js";
import { BuildSandboxes, type PlacedBuild } from "../src/master/templates/build-sandbox.js";
import { TokenIssuer } from "../src/master/tokens.js";
import { createDb, type Db } from "../src/store/db.js";
import { migrate } from "../src/store/migrations.js";
import { createTeam, type Team } from "../src/store/teams.js";
import { type BuildRecord, insertBuild, insertTemplate, markBuildBuilding } from "../src/store/templates.js";
import { DATABASE_URL } from "./api-harness.js";

// Two masters (two BuildSandboxes, each with its own PostgreSQL pool on one real database) share a node's build
// slots. The node agent and the registry of live nodes are seams of our own: a node agent that records the build
// sandboxes it was asked to create, and one node that is always live.
const NODE: NodeHeartbeat = {
  nodeId: "node-slots",
  addr: "127.0.0.1:1",
  driver: "namespace",
  cpuCount: 2,
  memoryTotalBytes: 64 * 1024 ** 3,
  memoryFreeBytes: 64 * 1024 ** 3,
  sandboxes: 0,
  pools: {},
  templates: ["base"],
  updatedAt: Date.now(),
};
const BASE: BuildBase = {
  nodeTemplateId: "base",
  key: "base",
  description: "base",
  context: { user: "user", workdir: null, env: {} },
  startCmd: null,
  readyCmd: null,
};

describe("build slots shared by every master", () => {
  const schema = `t_${randomBytes(6).toString("hex")}`;
  const dbs: Db[] = [createDb({ url: DATABASE_URL, schema, max: 4 }), createDb({ url: DATABASE_URL, schema, max: 4 })];
  const created: string[] = [];
  const nodeAgent = (() => ({
    create: async (request: { sandboxId: string }) => {
      created.push(request.sandboxId);
      return {};
    },
    kill: async () => undefined,
  })) as unknown as NodeAgentConnector;
  const registry = {
    placeableNodes: async () => [{ ...NODE, updatedAt: Date.now() }],
    liveNodes: async () => [{ ...NODE, updatedAt: Date.now() }],
  } as unknown as NodeRegistry;
  const log = { info: () => undefined, warn: () => undefined, error: () => undefined } as never;
  const masters = dbs.map(
    (db) =>
      new BuildSandboxes({
        db,
        registry,
        nodeAgent,
        tokens: new TokenIssuer(randomBytes(32).toString("hex")),
        config: { maxConcurrentPerNode: 1, timeoutMs: 60_000, diskMB: 1024, sandboxDiskMB: 1024 },
        memoryOvercommit: 1,
        log,
      }),
  );
  let team: Team;
  let templateId = "";

  beforeAll(async () => {
    await migrate(dbs[0] as Db, schema);
    team = await createTeam(dbs[0] as Db, "slots");
    templateId = `tpl${randomBytes(4).toString("hex")}`;
    await insertTemplate(
      dbs[0] as Db,
      { id: templateId, teamId: team.id, alias: "slots", cpuCount: 1, memoryMB: 512, diskSizeMB: 1024 },
      "0.1.0",
    );
  });

  afterAll(async () => {
    for (const db of dbs) await db.end();
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  });

  /** A build that is `building`, as the builder marks it before placing its sandbox. */
  async function building(): Promise<BuildRecord> {
    const id = randomUUID();
    const db = dbs[0] as Db;
    await insertBuild(db, {
      id,
      templateId,
      teamId: team.id,
      cpuCount: 1,
      memoryMB: 512,
      diskSizeMB: 1024,
      envdVersion: "0.1.0",
    });
    const marked = await markBuildBuilding(db, id, `b${id.replaceAll("-", "")}`, "nonce");
    if (!marked) throw new Error("build not marked building");
    return marked;
  }

  /** Starts `build`'s sandbox through `master`; the log lines it wrote come with the placement. */
  function start(master: BuildSandboxes, build: BuildRecord, signal = new AbortController().signal) {
    const buildLog = new BuildLog(master === masters[0] ? (dbs[0] as Db) : (dbs[1] as Db), build.id);
    const lines: string[] = [];
    const info = buildLog.info.bind(buildLog);
    buildLog.info = (message: string, step?: string) => {
      lines.push(message);
      info(message, step);
    };
    const placed = master.start(build, team, BASE, undefined, { signal, buildLog });
    return { placed, lines };
  }

  const settled = async (p: Promise<unknown>) =>
    Promise.race([
      p.then(
        () => "placed",
        () => "failed",
      ),
      new Promise((r) => setTimeout(() => r("waiting"), 300)),
    ]);

  it("a build on one master waits for the slot a build on the other master holds, and takes it when it is given back", async () => {
    const first = await building();
    const second = await building();
    const a = start(masters[0] as BuildSandboxes, first);
    const placedA = await a.placed;
    const b = start(masters[1] as BuildSandboxes, second);
    expect(await settled(b.placed)).toBe("waiting");
    expect(b.lines.join("\n")).toContain("waiting for a build slot: every node that can run this build already runs 1");

    await (masters[0] as BuildSandboxes).release(placedA, first.buildSandboxId as string);
    // Another master's release is seen at its next look (within a second).
    const placedB = await b.placed;
    expect(placedB.nodeId).toBe(NODE.nodeId);
    expect(created).toEqual([first.buildSandboxId, second.buildSandboxId]);
    await (masters[1] as BuildSandboxes).release(placedB, second.buildSandboxId as string);
  });

  it("the oldest waiting build takes a freed slot, whichever master freed it; one whose wait ends leaves the queue", async () => {
    const holder = await building();
    const older = await building();
    const newer = await building();
    const gaveUp = await building();
    const held = await start(masters[0] as BuildSandboxes, holder).placed;
    const waitsOnB = start(masters[1] as BuildSandboxes, older);
    expect(await settled(waitsOnB.placed)).toBe("waiting");
    const abort = new AbortController();
    const abandoned = start(masters[0] as BuildSandboxes, gaveUp, abort.signal);
    expect(await settled(abandoned.placed)).toBe("waiting");
    const waitsOnA = start(masters[0] as BuildSandboxes, newer);
    expect(await settled(waitsOnA.placed)).toBe("waiting");
    expect(waitsOnA.lines.join("\n")).toContain("(2 queued ahead)");

    abort.abort(new Error("build timed out"));
    await expect(abandoned.placed).rejects.toThrow("build timed out");
    // Master A frees the slot; its own waiting build is newer than B's, so B's build takes it.
    await (masters[0] as BuildSandboxes).release(held, holder.buildSandboxId as string);
    const placedOlder = await waitsOnB.placed;
    expect(await settled(waitsOnA.placed)).toBe("waiting");
    await (masters[1] as BuildSandboxes).release(placedOlder, older.buildSandboxId as string);
    const placedNewer = await waitsOnA.placed;
    await (masters[0] as BuildSandboxes).release(placedNewer, newer.buildSandboxId as string);
    expect(created.slice(-3)).toEqual([holder.buildSandboxId, older.buildSandboxId, newer.buildSandboxId]);
  });

  it("a build whose master died (marked failed as abandoned) no longer holds its slot", async () => {
    const orphan = await building();
    const next = await building();
    await start(masters[0] as BuildSandboxes, orphan).placed;
    const waiting = start(masters[1] as BuildSandboxes, next);
    expect(await settled(waiting.placed)).toBe("waiting");
    await (dbs[0] as Db).query("UPDATE template_builds SET status = 'error' WHERE id = $1", [orphan.id]);
    const placed: PlacedBuild = await waiting.placed;
    await (masters[1] as BuildSandboxes).release(placed, next.buildSandboxId as string);
  });
});
