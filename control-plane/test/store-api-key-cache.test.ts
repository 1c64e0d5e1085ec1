import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CachedApiKeyIdentities } from "../src/store/api-key-cache.js";
import { createDb, type Db, type Queryable } from "../src/store/db.js";
import { migrate } from "../src/store/migrations.js";
import { createApiKey, createTeam, revokeApiKey, updateTeam } from "../src/store/teams.js";
import { DATABASE_URL } from "./api-harness.js";

/** The database as the cache sees it, counting the lookups that reach PostgreSQL. */
function counting(db: Db): Queryable & { lookups: number } {
  const counted = {
    lookups: 0,
    query: (text: string, values?: unknown[]) => {
      counted.lookups += 1;
      return db.query(text, values);
    },
  };
  return counted as unknown as Queryable & { lookups: number };
}

async function until(check: () => Promise<boolean> | boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not reached in time");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("the api's API key cache", () => {
  const schema = `t_${randomBytes(6).toString("hex")}`;
  let db: Db;
  // A long lifetime: whatever the cache forgets in these tests, it forgets because it heard of the change.
  const caches: CachedApiKeyIdentities[] = [];
  const cacheFor = (queryable: Queryable, listenRetryMs?: number) => {
    const cache = new CachedApiKeyIdentities({
      db: queryable,
      databaseUrl: DATABASE_URL,
      schema,
      ttlMs: 3_600_000,
      ...(listenRetryMs === undefined ? {} : { listenRetryMs }),
    });
    caches.push(cache.start());
    return cache;
  };
  /** A lookup of `key` that the cache keeps: it keeps only once it listens. */
  const kept = async (cache: CachedApiKeyIdentities, key: string) => {
    await until(async () => {
      await cache.identify(key);
      return cache.size > 0;
    });
  };

  beforeAll(async () => {
    db = createDb({ url: DATABASE_URL, schema });
    await migrate(db, schema);
  });

  afterAll(async () => {
    await Promise.all(caches.map((cache) => cache.stop()));
    await db.end();
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  });

  it("answers a known key from memory, and an unknown key from PostgreSQL every time", async () => {
    const team = await createTeam(db, "cached");
    const key = await createApiKey(db, team.id);
    const counted = counting(db);
    const cache = cacheFor(counted);
    await kept(cache, key.key);
    const before = counted.lookups;
    for (let i = 0; i < 5; i++) expect((await cache.identify(key.key))?.team.id).toBe(team.id);
    expect(counted.lookups).toBe(before);
    expect(await cache.identify("e2b_not-a-key")).toBeUndefined();
    expect(await cache.identify("e2b_not-a-key")).toBeUndefined();
    expect(counted.lookups).toBe(before + 2);
    expect(cache.size).toBe(1);
  });

  it("a key revoked elsewhere (another replica, the CLI, SQL) stops working once the change commits", async () => {
    const team = await createTeam(db, "revoked");
    const key = await createApiKey(db, team.id);
    const cache = cacheFor(db);
    await kept(cache, key.key);
    // A different connection, as another replica's: only PostgreSQL's notification tells this cache.
    const elsewhere = createDb({ url: DATABASE_URL, schema });
    try {
      expect(await revokeApiKey(elsewhere, key.id)).toBe(true);
    } finally {
      await elsewhere.end();
    }
    await until(async () => (await cache.identify(key.key)) === undefined);
    expect(cache.size).toBe(0);
  });

  it("a team's new limits reach the next lookups; a change of this replica's own is seen at once", async () => {
    const team = await createTeam(db, "limits", { maxConcurrentSandboxes: 3 });
    const key = await createApiKey(db, team.id);
    const cache = cacheFor(db);
    await kept(cache, key.key);
    await updateTeam(db, team.id, { maxConcurrentSandboxes: 7 });
    await until(async () => (await cache.identify(key.key))?.team.maxConcurrentSandboxes === 7);
    // The admin API's path: it changes the row and forgets at once, before it answers.
    await updateTeam(db, team.id, { maxConcurrentSandboxes: 9 });
    cache.forget();
    expect((await cache.identify(key.key))?.team.maxConcurrentSandboxes).toBe(9);
  });

  it("a lookup that a change overtook is not kept (it may have read the row before the change)", async () => {
    const team = await createTeam(db, "overtaken");
    const key = await createApiKey(db, team.id);
    let overtake = false;
    const racing = {
      query: async (text: string, values?: unknown[]) => {
        const result = await db.query(text, values);
        if (overtake) {
          // The lookup has its row; a change commits and its notification arrives before the answer is kept.
          overtake = false;
          await updateTeam(db, team.id, { maxCreatesPerMinute: 11 });
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
        return result;
      },
    } as unknown as Queryable;
    const cache = cacheFor(racing);
    await kept(cache, key.key);
    cache.forget();
    overtake = true;
    expect((await cache.identify(key.key))?.team.maxCreatesPerMinute).toBe(600);
    expect(cache.size).toBe(0);
    expect((await cache.identify(key.key))?.team.maxCreatesPerMinute).toBe(11);
    expect(cache.size).toBe(1);
  });

  it("while its listening connection is down it keeps nothing, and it keeps again once it listens", async () => {
    const team = await createTeam(db, "listener");
    const key = await createApiKey(db, team.id);
    const counted = counting(db);
    const cache = cacheFor(counted, 3000);
    await kept(cache, key.key);
    const channel = `warren_identity_${schema}`;
    const listening = await db.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE query = $1", [
      `LISTEN "${channel}"`,
    ]);
    expect(listening.rows.length).toBeGreaterThan(0);
    for (const { pid } of listening.rows) await db.query("SELECT pg_terminate_backend($1)", [pid]);
    await until(() => cache.size === 0);
    // Down (for 3 s): every lookup reaches PostgreSQL, nothing is kept (a notification now would be lost).
    const before = counted.lookups;
    await cache.identify(key.key);
    await cache.identify(key.key);
    expect(counted.lookups).toBe(before + 2);
    expect(cache.size).toBe(0);
    // It listens again and keeps again; a revocation still reaches it.
    await kept(cache, key.key);
    await revokeApiKey(db, key.id);
    await until(async () => (await cache.identify(key.key)) === undefined);
  });
});
