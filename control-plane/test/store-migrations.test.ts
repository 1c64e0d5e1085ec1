import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { createDb } from "../src/store/db.js";
import { MIGRATIONS, migrate } from "../src/store/migrations.js";
import { DATABASE_URL } from "./api-harness.js";

describe("schema migrations", () => {
  const schema = `t_${randomBytes(6).toString("hex")}`;
  const dbs = [createDb({ url: DATABASE_URL, schema }), createDb({ url: DATABASE_URL, schema })];

  afterAll(async () => {
    for (const db of dbs) await db.end();
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  });

  it("applies each version exactly once, even when two starters race", async () => {
    const [a, b] = await Promise.all(dbs.map((db) => migrate(db, schema)));
    const all = MIGRATIONS.map((m) => m.version);
    expect([...(a ?? []), ...(b ?? [])].sort((x, y) => x - y)).toEqual(all);
    const again = await migrate(dbs[0] as pg.Pool, schema);
    expect(again).toEqual([]);
    const rows = await dbs[0]?.query("SELECT version FROM schema_migrations ORDER BY version");
    expect(rows?.rows.map((r) => r.version)).toEqual(all);
  });

  it("creates the tables in the configured schema only", async () => {
    const tables = await dbs[0]?.query<{ table_name: string }>(
      "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name",
      [schema],
    );
    expect(tables?.rows.map((r) => r.table_name)).toEqual([
      "api_keys",
      "artifacts",
      "exec_approvals",
      "nodes",
      "sandbox_events",
      "sandbox_metrics",
      "sandboxes",
      "schema_migrations",
      "secret_grants",
      "secrets",
      "snapshot_copies",
      "snapshots",
      "teams",
      "template_build_logs",
      "template_builds",
      "template_files",
      "template_layers",
      "template_tags",
      "template_upload_links",
      "templates",
      "volume_tokens",
      "volumes",
    ]);
  });
});
