import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// The shipped templates come from the template builder: a node agent that lacks `base` says so in its heartbeat,
// the master's template builder builds `base`'s spec (templates/shipped-specs.ts) on that node as an ordinary build
// owned by the `warren` team, and hands the ready snapshot over, which the node flattens into its template. The
// templates folder is the test's own, so nothing the host built before is used.
const dataDir = mkdtempSync(join(tmpdir(), "warren-sfb-"));
const templatesDir = join(dataDir, "templates");
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "sf",
  nodeCidr: () => "10.205.0.0/22",
  env: { WARREN_TEMPLATES_DIR: templatesDir },
});
let env: ClusterEnv;
const created: Sandbox[] = [];

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 900_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("shipped templates from the template builder", () => {
  it("a node without `base` gets it built by the master's builder on the node, and sandboxes of it work", async () => {
    const sandbox = await Sandbox.create("base", { timeoutMs: 120_000, requestTimeoutMs: 600_000 });
    created.push(sandbox);
    expect((await sandbox.commands.run("whoami")).stdout.trim()).toBe("user");
    // `base`'s step ran: the login profile asks bash's EUID instead of running `id -u`.
    const profile = await sandbox.commands.run("sudo -n true && grep -q 'EUID:-' /etc/profile && echo ok");
    expect(profile.stdout.trim()).toBe("ok");

    // The node's template says where it came from: the build, whose spec is `base`'s.
    const dirs = readdirSync(templatesDir).filter((name) => /^base-[0-9a-f]{16}$/.test(name));
    expect(dirs).toHaveLength(1);
    const manifest = JSON.parse(readFileSync(join(templatesDir, dirs[0] as string, "manifest.json"), "utf8"));
    expect(manifest.builder.spec.fromDebian.suite).toBe("bookworm");
    expect(manifest.builder.buildId).toMatch(/^[0-9a-f-]{36}$/);

    // An ordinary build of the shipped template, owned by the `warren` team, with its log.
    const db = new pg.Client({ connectionString: cluster.databaseUrl });
    await db.connect();
    try {
      await db.query(`SET search_path TO ${cluster.dbSchema}`);
      const build = await db.query("SELECT status, team_id, spec FROM template_builds WHERE id = $1", [
        manifest.builder.buildId,
      ]);
      expect(build.rows[0]?.status).toBe("ready");
      expect(build.rows[0]?.team_id).toBe("warren");
      expect(build.rows[0]?.spec.onNode).toBe("node-sfa");
      const logs = await db.query("SELECT message FROM template_build_logs WHERE build_id = $1 ORDER BY seq", [
        manifest.builder.buildId,
      ]);
      const text = logs.rows.map((r) => r.message as string).join("\n");
      expect(text).toContain("FROM debian:bookworm (debootstrap");
      expect(text).toMatch(/\[builder 1\/1\] RUN/);
      // The `warren` team has no key: nobody acts as it.
      expect((await db.query("SELECT count(*)::int AS n FROM api_keys WHERE team_id = 'warren'")).rows[0]?.n).toBe(0);
    } finally {
      await db.end();
    }

    // The node awaits nothing any more, and no build sandbox is left (no route of one in Redis).
    const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
    try {
      await expect.poll(() => redis.hget("warren:node:node-sfa", "templatesWanted"), { timeout: 15_000 }).toBe("[]");
      expect(await redis.keys("warren:route:b*")).toEqual([]);
    } finally {
      redis.disconnect();
    }
  }, 900_000);
});
