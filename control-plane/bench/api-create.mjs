// Control-plane overhead of sandbox create: REST → api → master (PostgreSQL, ledger) → node agent, with the node
// agent faked in-process (so the figures exclude sandbox start). Prints p50/p99; asserts nothing. Two api replicas
// share the master, one keeping known API keys (WARREN_API_KEY_CACHE_MS, the default) and one looking every key up
// (0); the sequential phases alternate between them in rounds, side by side.
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
const startApi = (cacheMs) =>
  ApiServer.start({
    config: loadApiConfig(
      { ...env, WARREN_API_PORT: "0", WARREN_MASTER_URL: master.url, WARREN_API_KEY_CACHE_MS: cacheMs },
      () => undefined,
    ),
    log: silentLogger,
  });
const apis = { cached: await startApi("60000"), uncached: await startApi("0") };
const api = apis.cached;
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

async function createOne(through = api) {
  const started = performance.now();
  const res = await fetch(`${through.url}/v2/sandboxes`, {
    method: "POST",
    headers: { "X-API-KEY": key, "Content-Type": "application/json" },
    body: '{"templateID":"base"}',
  });
  const body = await res.json();
  return { ms: performance.now() - started, ok: res.status === 201, sandboxId: body.sandboxID };
}

/** A read a client makes often (the SDK's getInfo / connect): little work besides the key check. */
async function getOne(through, sandboxId) {
  const started = performance.now();
  const res = await fetch(`${through.url}/sandboxes/${sandboxId}`, { headers: { "X-API-KEY": key } });
  await res.arrayBuffer();
  return { ms: performance.now() - started, ok: res.status === 200 };
}

function report(name, results) {
  const ms = results.map((r) => r.ms).sort((a, b) => a - b);
  const pick = (q) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))].toFixed(2);
  const failures = results.filter((r) => !r.ok).length;
  console.log(`${name}: n=${ms.length} p50=${pick(0.5)} ms p99=${pick(0.99)} ms failures=${failures}`);
}

try {
  let sandboxId;
  for (const through of Object.values(apis))
    for (let i = 0; i < 10; i++) sandboxId = (await createOne(through)).sandboxId;
  const seq = { cached: [], uncached: [] };
  const get = { cached: [], uncached: [] };
  const round = 25;
  for (let done = 0; done < sequential; done += round) {
    for (const [name, through] of Object.entries(apis)) {
      for (let i = 0; i < round; i++) seq[name].push(await createOne(through));
      // A sandbox just made: the master's reconcile ends the fake node's sandboxes after a while.
      sandboxId = seq[name].at(-1).sandboxId;
      for (let i = 0; i < round; i++) get[name].push(await getOne(through, sandboxId));
    }
  }
  for (const name of Object.keys(apis)) {
    report(`sequential create (api+master, fake node), key ${name}`, seq[name]);
    report(`sequential GET /sandboxes/{id}, key ${name}`, get[name]);
  }
  report(
    "concurrent create (api+master, fake node)",
    await Promise.all(Array.from({ length: concurrent }, () => createOne())),
  );
} finally {
  for (const one of Object.values(apis)) await one.stop();
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
