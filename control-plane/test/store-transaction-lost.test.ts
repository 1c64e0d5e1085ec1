import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { createDb, withTransaction } from "../src/store/db.js";
import { DATABASE_URL } from "./api-harness.js";

// A transaction that awaits other work (a node agent's answer) while PostgreSQL ends its connection (a restart):
// it fails with an error, and the process goes on (an unhandled 'error' of the checked-out client would end it,
// which vitest reports as an unhandled error). Real PostgreSQL; the connection is ended with
// pg_terminate_backend, what a fast shutdown does to every client.
describe("a transaction whose server goes away", () => {
  const db = createDb({ url: DATABASE_URL, schema: "public", max: 2 });
  afterAll(() => db.end());

  it("fails, the process carries on, and the pool serves the next query", async () => {
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    try {
      const outcome = await withTransaction(db, async (tx) => {
        const pid = (await tx.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]?.pid;
        await admin.query("SELECT pg_terminate_backend($1)", [pid]);
        // Other work meanwhile: the termination arrives while no query of this client is running.
        await sleep(300);
        return "committed";
      }).catch((error: Error) => error);
      expect(outcome).toBeInstanceOf(Error);
      expect((await db.query<{ one: number }>("SELECT 1 AS one")).rows[0]?.one).toBe(1);
    } finally {
      await admin.end();
    }
  });
});

describe("a transaction with a lock timeout", () => {
  const db = createDb({ url: DATABASE_URL, schema: "public", max: 2 });
  afterAll(() => db.end());

  it("has it from its first statement, gives up on a held row lock after it, and leaves the next transaction without it", async () => {
    const shown = await withTransaction(
      db,
      async (tx) => (await tx.query<{ lock_timeout: string }>("SHOW lock_timeout")).rows[0]?.lock_timeout,
      { lockTimeoutMs: 250 },
    );
    expect(shown).toBe("250ms");
    // A row held by another transaction: the waiter fails after about its timeout with PostgreSQL's lock_not_available.
    await db.query("CREATE TABLE IF NOT EXISTS warren_lock_probe (id int PRIMARY KEY)");
    await db.query("INSERT INTO warren_lock_probe VALUES (1) ON CONFLICT DO NOTHING");
    try {
      const outcome = await withTransaction(db, async (holder) => {
        await holder.query("SELECT * FROM warren_lock_probe WHERE id = 1 FOR UPDATE");
        const started = Date.now();
        const error = await withTransaction(
          db,
          (waiter) => waiter.query("SELECT * FROM warren_lock_probe WHERE id = 1 FOR UPDATE"),
          { lockTimeoutMs: 200 },
        ).catch((caught: { code?: string }) => caught);
        return { code: (error as { code?: string }).code, waitedMs: Date.now() - started };
      });
      expect(outcome.code).toBe("55P03");
      expect(outcome.waitedMs).toBeGreaterThanOrEqual(150);
      const after = await withTransaction(
        db,
        async (tx) => (await tx.query<{ lock_timeout: string }>("SHOW lock_timeout")).rows[0]?.lock_timeout,
      );
      expect(after).toBe("0");
      await expect(withTransaction(db, async () => 1, { lockTimeoutMs: 1.5 })).rejects.toThrow(/whole milliseconds/);
    } finally {
      await db.query("DROP TABLE IF EXISTS warren_lock_probe");
    }
  });
});
