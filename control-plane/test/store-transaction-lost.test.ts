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
