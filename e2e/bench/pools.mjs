#!/usr/bin/env node
// Warm pools and bursts (issue 20): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/pools.mjs [--quick] [--env NAME=VALUE ...] [--separate-master]
// One node agent with the default pool configuration (`--env` overrides it, e.g. --env WARREN_POOL_REFILL=1),
// driven with the official e2b SDK through the proxy:
//   1. 30 creates back to back (create → first commands.run('true') → kill), twice: the first round starts from
//      the pool's floor, the second 5 s later, when the pool has followed the first round's demand;
//   2. 100 concurrent creates: failures, p50/p99 of create and of create → first command (once the pool holds its
//      floor again: with --env WARREN_POOL_SIZE=100 it measures a burst a pool was sized for);
//   3. the same burst again once the pool has followed the first one's demand (up to WARREN_POOL_MAX, 32 by
//      default: --env WARREN_POOL_MAX=100 --env WARREN_DISK_OVERCOMMIT=2 lets it hold a whole burst of 1 GiB disks);
//   4. the `base` pool's ready sandboxes over the whole run (from the node's heartbeats);
//   5. with each burst, the host's CPU it took per create (create + first command), by component (/proc): a burst
//      on a small node is bound by CPU, so its p99 is at least the CPU per create × creates / cores.
// How many creates the pool served (the node agent's "sandbox created" lines) is printed with each figure: on a
// shared, loaded machine it says more than the latencies do.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { NODES_SET_KEY, nodeKey } from "@warren/proto/redis";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";
import { clusterEnvFromArgs, clusterLayoutFromArgs } from "./cluster-args.mjs";
import { cpuBetween, printCpuPer, sampleCpu } from "./cpu-accounting.mjs";

const quick = process.argv.includes("--quick");
const extraEnv = clusterEnvFromArgs();
const BACK_TO_BACK = quick ? 10 : 30;
const CONCURRENT = quick ? 20 : 100;
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-pools-"));
const cluster = new LocalCluster({
  ...clusterLayoutFromArgs(),
  dataDir,
  nodeAgents: 1,
  instancePrefix: "ib",
  nodeCidr: () => "10.227.0.0/20",
  onProgress: (line) => process.stderr.write(`  ${line}\n`),
  env: {
    ...QUIET_CLUSTER_ENV,
    // Heartbeats carry the pool's ready count: sampled often enough to draw it.
    WARREN_HEARTBEAT_MS: "250",
    WARREN_MAX_SANDBOXES: "300",
    ...extraEnv,
  },
});

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
const ms = (n) => `${n.toFixed(0)} ms`;
const summary = (times) => {
  if (times.length === 0) return "n=0";
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${ms(pct(sorted, 50))}  p99 ${ms(pct(sorted, 99))}  max ${ms(sorted.at(-1))}  (n=${sorted.length})`;
};
const line = (label, text) => console.log(`${label.padEnd(46)} ${text}`);
const sleep = (msec) => new Promise((r) => setTimeout(r, msec));

/** How many of these sandboxes were ready in the warm pool, and how many waited for one of its starts. */
function servedFromPool(ids) {
  const log = readFileSync(join(dataDir, "logs", "node-agent-iba.log"), "utf8");
  const wanted = new Set(ids);
  let pooled = 0;
  let waited = 0;
  for (const text of log.split("\n")) {
    if (!text.includes('"sandbox created"')) continue;
    const entry = JSON.parse(text);
    if (!wanted.has(entry.sandboxId) || !entry.pooled) continue;
    if (entry.waitedForPool) waited++;
    else pooled++;
  }
  return `${pooled}/${wanted.size} from the pool, ${waited} waited for its start`;
}

/** The `base` pool's ready count from the node's heartbeats, with the phase it was seen in. */
class PoolSampler {
  samples = [];
  phase = "idle";
  #timer;
  #redis;
  #t0 = performance.now();

  start(redisUrl) {
    this.#redis = new Redis(redisUrl);
    this.#timer = setInterval(() => void this.sample(), 250);
  }

  async sample() {
    const nodes = await this.#redis.smembers(NODES_SET_KEY).catch(() => []);
    const pools = await Promise.all(nodes.map((n) => this.#redis.hget(nodeKey(n), "pools").catch(() => null)));
    const ready = pools.reduce((sum, p) => sum + (p ? (JSON.parse(p).base ?? 0) : 0), 0);
    this.samples.push({ t: (performance.now() - this.#t0) / 1000, phase: this.phase, ready });
  }

  async stop() {
    clearInterval(this.#timer);
    this.#redis?.disconnect();
  }

  /** One line per phase: min/max ready, then the series thinned to about 40 points. */
  print() {
    const phases = [...new Set(this.samples.map((s) => s.phase))];
    for (const phase of phases) {
      const of = this.samples.filter((s) => s.phase === phase);
      const step = Math.max(1, Math.ceil(of.length / 40));
      const series = of.filter((_, i) => i % step === 0).map((s) => s.ready);
      const from = of[0].t.toFixed(1);
      const to = of.at(-1).t.toFixed(1);
      line(
        `  ${phase} (${from}–${to} s)`,
        `ready min ${Math.min(...of.map((s) => s.ready))} max ${Math.max(...of.map((s) => s.ready))}: ${series.join(" ")}`,
      );
    }
  }
}

async function backToBack(label) {
  const cpuBefore = sampleCpu();
  const create = [];
  const toFirst = [];
  const ids = [];
  const failures = [];
  for (let i = 0; i < BACK_TO_BACK; i++) {
    const t0 = performance.now();
    try {
      const sandbox = await Sandbox.create();
      create.push(performance.now() - t0);
      ids.push(sandbox.sandboxId);
      await sandbox.commands.run("true");
      toFirst.push(performance.now() - t0);
      await sandbox.kill();
    } catch (error) {
      failures.push(String(error?.message ?? error).slice(0, 160));
    }
  }
  line(`${label}: Sandbox.create()`, `${summary(create)}  failures ${failures.length}  ${servedFromPool(ids)}`);
  for (const reason of failures) console.log(`  failed: ${reason}`);
  line(`${label}: create → first commands.run`, `${summary(toFirst)}  (target p50 <= 40 ms, p99 <= 100 ms)`);
  printCpuPer(`${label}: CPU, create + first command + kill`, cpuBetween(cpuBefore, sampleCpu()), BACK_TO_BACK);
}

async function burst(label) {
  const cpuBefore = sampleCpu();
  const started = performance.now();
  const results = await Promise.allSettled(
    Array.from({ length: CONCURRENT }, async () => {
      const t0 = performance.now();
      const sandbox = await Sandbox.create();
      const create = performance.now() - t0;
      await sandbox.commands.run("true");
      return { sandbox, create, toFirst: performance.now() - t0 };
    }),
  );
  const wall = performance.now() - started;
  const cpuUsed = cpuBetween(cpuBefore, sampleCpu());
  const ok = results.filter((r) => r.status === "fulfilled").map((r) => r.value);
  const failures = results.filter((r) => r.status === "rejected");
  line(
    `${label}: Sandbox.create()`,
    `${summary(ok.map((r) => r.create))}  failures ${failures.length}  wall ${ms(wall)}  ${servedFromPool(ok.map((r) => r.sandbox.sandboxId))}  (target 0 failures, p99 <= 1 s)`,
  );
  line(`${label}: create → first commands.run`, summary(ok.map((r) => r.toFirst)));
  const reasons = new Map();
  for (const f of failures) {
    const reason = String(f.reason?.message ?? f.reason).slice(0, 160);
    reasons.set(reason, (reasons.get(reason) ?? 0) + 1);
  }
  for (const [reason, n] of reasons) console.log(`  ${n} × ${reason}`);
  // A burst from a full pool is bound by this: p99 ≥ (CPU per create × creates) / cores.
  printCpuPer(`${label}: CPU, create + first command`, cpuUsed, CONCURRENT);
  await Promise.all(ok.map((r) => r.sandbox.kill().catch(() => false)));
}

/** Waits (up to 300 s) until the node's heartbeat reports at least `size` ready `base` sandboxes: whether it did. */
async function waitForPool(size) {
  const redis = new Redis(cluster.redisUrl);
  try {
    const deadline = Date.now() + 300_000;
    while (Date.now() < deadline) {
      const nodes = await redis.smembers(NODES_SET_KEY);
      const pools = await Promise.all(nodes.map((n) => redis.hget(nodeKey(n), "pools")));
      if (pools.some((p) => p && (JSON.parse(p).base ?? 0) >= size)) return true;
      await sleep(250);
    }
    return false;
  } finally {
    redis.disconnect();
  }
}

async function main() {
  const env = await cluster.start();
  useClusterForSdk(env);
  // The burst is one team's: its concurrency quota (100 by default) must not be what refuses it.
  const teams = await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams`, {
    headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN },
  }).then((r) => r.json());
  for (const team of teams) {
    await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams/${team.id}`, {
      method: "PATCH",
      headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN, "Content-Type": "application/json" },
      body: JSON.stringify({ maxConcurrentSandboxes: 1000, maxCreatesPerMinute: 10000 }),
    });
  }
  const overrides = Object.entries(extraEnv).map(([k, v]) => `${k}=${v}`);
  console.log(`Warren warm pools and bursts (${quick ? "quick" : "full"}), ${new Date().toISOString()}`);
  console.log(
    `one node agent, official e2b SDK through the proxy; ${overrides.join(" ") || "default pool settings"}\n`,
  );

  sampler.start(cluster.redisUrl);
  sampler.phase = "start";
  await waitForPool(1);
  await sleep(3000);
  sampler.phase = "round 1";
  await backToBack(`${BACK_TO_BACK} back to back, round 1`);
  sampler.phase = "idle 5 s";
  await sleep(5000);
  sampler.phase = "round 2";
  await backToBack(`${BACK_TO_BACK} back to back, round 2`);
  sampler.phase = "idle 10 s";
  await sleep(10_000);
  // A floor above the rounds' demand takes longer to refill than the idle pause.
  await waitForPool(Math.min(CONCURRENT, Number(extraEnv.WARREN_POOL_SIZE ?? 2)));
  sampler.phase = "burst 1";
  await burst(`${CONCURRENT} concurrent, burst 1`);
  sampler.phase = "refill";
  const followed = Math.min(CONCURRENT, Number(extraEnv.WARREN_POOL_MAX ?? 32));
  const refillStarted = performance.now();
  const refilled = await waitForPool(followed);
  const waited = ms(performance.now() - refillStarted);
  line(
    "  the pool following the burst",
    refilled ? `${followed} ready after ${waited}` : `not ${followed} ready in ${waited}`,
  );
  sampler.phase = "burst 2";
  await burst(`${CONCURRENT} concurrent, burst 2`);
  sampler.phase = "after";
  await sleep(5000);
  await sampler.stop();
  console.log("\nbase pool, ready sandboxes (heartbeats every 250 ms):");
  sampler.print();
}

const sampler = new PoolSampler();
main()
  .catch((error) => {
    console.error(error);
    process.exitCode = 1;
  })
  .finally(async () => {
    await sampler.stop();
    await cluster.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });
