// Control-plane overhead of sandbox create: REST → api → master (PostgreSQL, ledger) → node agent, with the node
// agent faked in-process (so the figures exclude sandbox start). Prints p50/p99; asserts nothing.
// Usage: npm run build && npm run bench:api -w control-plane -- [sequential=200] [concurrent=100]
import { randomBytes } from "node:crypto";
import { NODE_TTL_SECONDS, NODES_SET_KEY, nodeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import pg from "pg";
import { loadApiConfig } from "../dist/api/config.js";
import { ApiServer } from "../dist/api/server.js";
import { loadMasterConfig } from "../dist/master/config.js";
import { silentLogger } from "../dist/master/log.js";
import { Master } from "../dist/master/server.js";
import { createDb } from "../dist/store/db.js";
import { createApiKey, createTeam } from "../dist/store/teams.js";

const DATABASE_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const sequential = Number(process.argv[2] ?? 200);
const concurrent = Number(process.argv[3] ?? 100);
const schema = `bench_${randomBytes(4).toString("hex")}`;
const prefix = `wb-${schema}:`;

const fakeNode = {
  n: 0,
  async create() {
    return { exec: `e${++this.n}`, sandboxAddr: "10.0.0.2", envdUrl: "http://10.0.0.2:49983", envdVersion: "0.6.13" };
  },
  async kill() {},
  async list() {
    return [];
  },
  async pause() {},
  async resume() {
    return { exec: `e${++this.n}`, sandboxAddr: "10.0.0.2", envdUrl: "" };
  },
};

const redis = new Redis(REDIS_URL, { keyPrefix: prefix });
// The services' own configuration loaders (every interval at its default), with the bench's database and Redis.
const env = {
  DATABASE_URL,
  REDIS_URL,
  WARREN_DB_SCHEMA: schema,
  WARREN_REDIS_PREFIX: prefix,
  WARREN_TOKEN_SECRET: randomBytes(24).toString("hex"),
  WARREN_MASTER_PORT: "0",
  WARREN_DB_SYNCHRONOUS_COMMIT: "off",
  WARREN_MEMORY_OVERCOMMIT: "1000",
};
const master = await Master.start({
  config: loadMasterConfig(env, () => undefined),
  nodeAgent: () => fakeNode,
  log: silentLogger,
});
const api = await ApiServer.start({
  config: loadApiConfig({ ...env, WARREN_API_PORT: "0", WARREN_MASTER_URL: master.url }, () => undefined),
  log: silentLogger,
});
await redis.sadd(NODES_SET_KEY, "bench");
await redis.hset(nodeKey("bench"), {
  addr: "127.0.0.1:1",
  memoryTotalBytes: String(64 * 1024 ** 3),
  templates: '["base"]',
});
await redis.expire(nodeKey("bench"), NODE_TTL_SECONDS * 100);
const db = createDb({ url: DATABASE_URL, schema, max: 1 });
const team = await createTeam(db, "bench", { maxConcurrentSandboxes: 100_000, maxCreatesPerMinute: 100_000 });
const { key } = await createApiKey(db, team.id);

async function createOne() {
  const started = performance.now();
  const res = await fetch(`${api.url}/v2/sandboxes`, {
    method: "POST",
    headers: { "X-API-KEY": key, "Content-Type": "application/json" },
    body: '{"templateID":"base"}',
  });
  await res.arrayBuffer();
  return { ms: performance.now() - started, ok: res.status === 201 };
}

function report(name, results) {
  const ms = results.map((r) => r.ms).sort((a, b) => a - b);
  const pick = (q) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))].toFixed(2);
  const failures = results.filter((r) => !r.ok).length;
  console.log(`${name}: n=${ms.length} p50=${pick(0.5)} ms p99=${pick(0.99)} ms failures=${failures}`);
}

try {
  for (let i = 0; i < 10; i++) await createOne();
  const seq = [];
  for (let i = 0; i < sequential; i++) seq.push(await createOne());
  report("sequential create (api+master, fake node)", seq);
  report("concurrent create (api+master, fake node)", await Promise.all(Array.from({ length: concurrent }, createOne)));
} finally {
  await api.stop();
  await master.stop();
  await db.end();
  const plain = new Redis(REDIS_URL);
  const keys = await plain.keys(`${prefix}*`);
  if (keys.length) await plain.del(...keys);
  plain.disconnect();
  redis.disconnect();
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await admin.end();
}
