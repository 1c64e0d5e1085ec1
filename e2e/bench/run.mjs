#!/usr/bin/env node
// Whole-cluster benchmarks (issue 5): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/run.mjs [--quick]
// Starts its own cluster (private PostgreSQL and Redis, master, api, two node agents, proxy) in a temp dir,
// drives it with the official e2b SDK through the proxy (E2B_SANDBOX_URL header routing), and stops it.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { NODES_SET_KEY, nodeKey } from "@warren/proto/redis";
import { Sandbox } from "e2b";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const quick = process.argv.includes("--quick");
const poolArg = process.argv.indexOf("--pool");
const poolSize = poolArg > 0 ? Number(process.argv[poolArg + 1]) : 4;
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 2,
  poolSize,
  instancePrefix: "z",
  nodeCidr: (i) => `10.214.${i * 16}.0/20`,
  onProgress: (line) => process.stderr.write(`  ${line}\n`),
  env: QUIET_CLUSTER_ENV,
});

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const ms = (n) => `${n.toFixed(1)} ms`;
const summary = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${ms(pct(sorted, 50))}  p99 ${ms(pct(sorted, 99))}  (n=${sorted.length})`;
};

async function main() {
  const env = await cluster.start();
  useClusterForSdk(env);
  console.log(`Warren whole-cluster benchmarks (${quick ? "quick" : "full"}), ${new Date().toISOString()}`);
  console.log(`two node agents (warm pool ${poolSize} each), official e2b SDK through the proxy\n`);

  const creates = quick ? 15 : 50;
  const toFirstRun = [];
  const createOnly = [];
  for (let i = 0; i < creates; i++) {
    const t0 = performance.now();
    const sandbox = await Sandbox.create();
    const t1 = performance.now();
    await sandbox.commands.run("true");
    toFirstRun.push(performance.now() - t0);
    createOnly.push(t1 - t0);
    await sandbox.kill();
    // Let the warm pools refill, as they would between user requests.
    await new Promise((r) => setTimeout(r, 150));
  }
  console.log(`Sandbox.create()                        ${summary(createOnly)}`);
  console.log(`create → first commands.run completed   ${summary(toFirstRun)}  (target p50 <= 40 ms)`);

  const sandbox = await Sandbox.create();
  for (let i = 0; i < 20; i++) await sandbox.commands.run("true");
  const runs = [];
  for (let i = 0; i < (quick ? 50 : 200); i++) {
    const t0 = performance.now();
    await sandbox.commands.run("true");
    runs.push(performance.now() - t0);
  }
  console.log(
    `commands.run('true') through the proxy  ${summary(runs)}  (target p50 <= 3 ms; bash -l costs ~5 ms alone)`,
  );
  await sandbox.kill();

  // The burst starts with full warm pools, as after a quiet period.
  await waitForPools(poolSize);
  const concurrent = quick ? 20 : 100;
  const started = performance.now();
  const results = await Promise.allSettled(
    Array.from({ length: concurrent }, async () => {
      const t0 = performance.now();
      const s = await Sandbox.create();
      return { sandbox: s, ms: performance.now() - t0 };
    }),
  );
  const wall = performance.now() - started;
  const ok = results.filter((r) => r.status === "fulfilled").map((r) => r.value);
  const failures = results.filter((r) => r.status === "rejected");
  console.log(
    `${concurrent} concurrent creates, two nodes     ${summary(ok.map((r) => r.ms))}  failures ${failures.length}  wall ${ms(wall)}  (target p99 <= 1 s, 0 failures)`,
  );
  if (failures[0]) console.log(`  first failure: ${failures[0].reason}`);
  await Promise.all(ok.map((r) => r.sandbox.kill().catch(() => false)));
}

/** Waits until every node agent's heartbeat reports a full `base` pool. */
async function waitForPools(size) {
  const { Redis } = await import("ioredis");
  const redis = new Redis(cluster.redisUrl);
  try {
    const deadline = Date.now() + 300_000;
    while (Date.now() < deadline) {
      const nodes = await redis.smembers(NODES_SET_KEY);
      const pools = await Promise.all(nodes.map((n) => redis.hget(nodeKey(n), "pools")));
      if (nodes.length === 2 && pools.every((p) => p && (JSON.parse(p).base ?? 0) >= size)) return;
      await new Promise((r) => setTimeout(r, 500));
    }
  } finally {
    redis.disconnect();
  }
}

main()
  .catch((error) => {
    console.error(error);
    process.exitCode = 1;
  })
  .finally(async () => {
    await cluster.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });
