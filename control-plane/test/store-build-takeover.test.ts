import { randomBytes, randomUUID } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BuildLog } from "../src/master/templates/build-log.js";
import { MASTER_LIVENESS_CLASS, newLivenessKey, TRY_LIVENESS_LOCK_SQL } from "../src/store/master-liveness.js";
import { migrate } from "../src/store/migrations.js";
import { createTeam } from "../src/store/teams.js";
import {
  abandonedBuilds,
  type BuildResult,
  failAbandonedBuild,
  getBuild,
  handOffBuild,
  insertBuild,
  insertTemplate,
  markBuildBuilding,
  markBuildFailed,
  markBuildReady,
  takeOverBuild,
  touchBuild,
} from "../src/store/templates.js";
import { DATABASE_URL, testSchema } from "./api-harness.js";

// A build handed over by a stopping master (or left by a dead one) is taken over by another master with a new
// nonce: the old run can no longer heartbeat, finish or fail it. Real PostgreSQL, a schema of its own.
const STALE_MS = 60_000;
const RESULT: BuildResult = {
  nodeId: "node-a",
  snapshotId: "tsnap",
  layerSnapshotId: "lsnap",
  baseTemplateId: "base",
  startCmd: null,
  readyCmd: null,
  context: { user: "user", workdir: null, env: {} },
  layerKeys: [],
  diskSizeMB: 1024,
};

describe("taking over a template build", () => {
  const { schema, db, drop } = testSchema();
  let teamId = "";
  let templateId = "";

  beforeAll(async () => {
    await migrate(db, schema);
    teamId = (await createTeam(db, "takeover")).id;
    templateId = `tpl${randomBytes(4).toString("hex")}`;
    await insertTemplate(
      db,
      { id: templateId, teamId, alias: "takeover", cpuCount: 1, memoryMB: 512, diskSizeMB: 1024 },
      "0.1.0",
    );
  });

  afterAll(drop);

  async function building(nonce: string, masterLock: number | null = null) {
    const id = randomUUID();
    await insertBuild(db, {
      id,
      templateId,
      teamId,
      cpuCount: 1,
      memoryMB: 512,
      diskSizeMB: 1024,
      envdVersion: "0.1.0",
    });
    await markBuildBuilding(db, id, `b${id.replaceAll("-", "")}`, nonce, masterLock);
    return id;
  }

  it("a handed-over build is abandoned at once; the taker gets a new sandbox id and nonce, the old run is fenced off", async () => {
    const id = await building("old");
    expect(await touchBuild(db, id, "old")).toBe(true);
    expect((await abandonedBuilds(db, STALE_MS)).map((b) => b.id)).not.toContain(id);
    // Only the run that holds it can hand it over.
    expect(await handOffBuild(db, id, "someone-else")).toBe(false);
    expect(await handOffBuild(db, id, "old")).toBe(true);
    expect((await abandonedBuilds(db, STALE_MS)).map((b) => b.id)).toContain(id);

    const taken = await takeOverBuild(db, id, STALE_MS, "bnewt1", "new");
    expect(taken).toMatchObject({ takeovers: 1, buildSandboxId: "bnewt1", tokenNonce: "new", status: "building" });
    // A second master racing for it gets nothing: it is fresh again.
    expect(await takeOverBuild(db, id, STALE_MS, "bnewt1", "other")).toBeUndefined();
    expect(await failAbandonedBuild(db, id, STALE_MS, "too late")).toBe(false);

    expect(await touchBuild(db, id, "old")).toBe(false);
    expect(await markBuildReady(db, id, RESULT, "old")).toBe(false);
    expect(await markBuildFailed(db, id, { message: "old run" }, "old")).toBe(false);
    expect(await markBuildReady(db, id, RESULT, "new")).toBe(true);
    expect((await getBuild(db, id))?.status).toBe("ready");
  });

  it("an abandoned build no master can continue is failed with the reason", async () => {
    const id = await building("gone");
    await handOffBuild(db, id, "gone");
    expect(
      await failAbandonedBuild(db, id, STALE_MS, "cannot be continued (its registry credentials are never stored)"),
    ).toBe(true);
    expect(await getBuild(db, id)).toMatchObject({
      status: "error",
      reason: { message: "cannot be continued (its registry credentials are never stored)" },
    });
  });

  it("the taker's log goes on after the lines the first run wrote", async () => {
    const id = await building("log");
    const first = new BuildLog(db, id);
    first.info("line 1");
    first.info("line 2");
    await first.flush();
    const next = await BuildLog.continuing(db, id);
    next.info("line 3");
    await next.flush();
    const rows = await db.query<{ seq: number; message: string }>(
      "SELECT seq, message FROM template_build_logs WHERE build_id = $1 ORDER BY seq",
      [id],
    );
    expect(rows.rows).toEqual([
      { seq: 0, message: "line 1" },
      { seq: 1, message: "line 2" },
      { seq: 2, message: "line 3" },
    ]);
  });

  it("a build whose master died (its liveness lock is gone) is abandoned at once, heartbeat or not", async () => {
    // The master's own connection holding its lock, as master/liveness.ts keeps one.
    const session = new pg.Client({ connectionString: DATABASE_URL });
    await session.connect();
    const key = newLivenessKey();
    const taken = await session.query(TRY_LIVENESS_LOCK_SQL, [MASTER_LIVENESS_CLASS, key]);
    expect(taken.rows[0].ok).toBe(true);
    const id = await building("alive", key);
    expect(await touchBuild(db, id, "alive")).toBe(true);
    expect((await abandonedBuilds(db, STALE_MS)).map((b) => b.id)).not.toContain(id);
    expect(await takeOverBuild(db, id, STALE_MS, "bnot", "thief")).toBeUndefined();

    await session.end(); // the master's process dies: PostgreSQL drops its session and the lock with it
    for (let i = 0; i < 100 && !(await abandonedBuilds(db, STALE_MS)).some((b) => b.id === id); i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect((await abandonedBuilds(db, STALE_MS)).map((b) => b.id)).toContain(id);
    // The taker records its own key: the build is alive again while that one is held.
    const next = new pg.Client({ connectionString: DATABASE_URL });
    await next.connect();
    try {
      const nextKey = newLivenessKey();
      await next.query(TRY_LIVENESS_LOCK_SQL, [MASTER_LIVENESS_CLASS, nextKey]);
      expect(await takeOverBuild(db, id, STALE_MS, "bnewt1", "new", nextKey)).toMatchObject({ takeovers: 1 });
      expect((await abandonedBuilds(db, STALE_MS)).map((b) => b.id)).not.toContain(id);
      expect(await failAbandonedBuild(db, id, STALE_MS, "not abandoned")).toBe(false);
    } finally {
      await next.end();
    }
  });
});
