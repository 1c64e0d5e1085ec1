#!/usr/bin/env node
// Node agent benchmark (namespace driver): create → envd ready (warm pool and cold), 50 concurrent creates,
// idle sandbox memory (memcg usage and PSS), teardown time. Prints figures; asserts nothing.
// Run as root after `npx tsc --build`: `npm run bench -w control-plane` (BENCH_N=50 BENCH_CONCURRENT=50).
import { readFileSync } from "node:fs";
import { loadNodeAgentConfig } from "../dist/node-agent/config.js";
import { createLogger } from "../dist/node-agent/log.js";
import { startNodeAgent } from "../dist/node-agent/node-agent.js";

const N = Number(process.env.BENCH_N ?? 50);
const CONCURRENT = Number(process.env.BENCH_CONCURRENT ?? 50);
const config = loadNodeAgentConfig({
  WARREN_NODE_ID: "bench",
  WARREN_AGENT_LISTEN: "127.0.0.1:0",
  WARREN_STATE_DIR: "/var/lib/warren/bench",
  WARREN_INSTANCE: "bn",
  // A range no test uses: a bench's leftover sandboxes must never shadow a test cluster's routes.
  WARREN_NET_CIDR: "10.253.0.0/20",
  WARREN_POOL_SIZE: "2",
  WARREN_NET_POOL_SIZE: "8",
  WARREN_PREBUILD_TEMPLATES: "",
  WARREN_LOG_LEVEL: "error",
  // A benchmark measures this machine, it does not change it.
  WARREN_UPLINK_FORWARDING: "0",
  WARREN_DNS_UPSTREAM: "127.0.0.1:9",
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const pct = (values, p) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
};
const fmt = (values) =>
  `n=${values.length} min ${Math.min(...values).toFixed(1)} / p50 ${pct(values, 50).toFixed(1)} / p99 ${pct(values, 99).toFixed(1)} / max ${Math.max(...values).toFixed(1)} ms`;

// E2B's default egress (internet on), as the master asks for it: a pooled sandbox already has it, so a claim
// changes no firewall rule (a create that asks for closed egress pays ~40 ms of iptables on top).
const OPEN = { allowOut: [], denyOut: [] };
const running = await startNodeAgent(config, createLogger("node-agent", { level: "error" }));
const { agent, driver } = running;
await agent.ensureTemplate("base");
const template = running.templates.ready("base");
const defaults = template.recipe.defaults;
let seq = 0;
const nextId = () => `bench${process.pid}x${seq++}`;
const teardown = [];

async function killTimed(sandboxId) {
  const t0 = performance.now();
  await agent.kill(sandboxId);
  teardown.push(performance.now() - t0);
}

console.log(
  `warren node agent benchmark: driver ${driver.name}, cgroup v${driver.cgroupVersion}, ${N} creates per mode`,
);

// Warm pool: the pool holds started sandboxes; create = claim + envd /init + route write.
const pooled = [];
for (let i = 0; i < N; i++) {
  await agent.pool("base").filled();
  const id = nextId();
  const t0 = performance.now();
  const placement = await agent.create({
    sandboxId: id,
    teamId: "bench",
    templateId: "base",
    envdAccessToken: "t",
    egress: OPEN,
  });
  pooled.push(performance.now() - t0);
  if (!placement.pooled) console.log("  (a pooled create fell back to a cold start)");
  await killTimed(id);
}
console.log(`create → envd ready, warm pool:        ${fmt(pooled)}`);

// Cold: other resources than the template's defaults, so the pool cannot serve it; the network namespace still
// comes from the (pre-made) network pool, as on a real node.
const cold = [];
for (let i = 0; i < N; i++) {
  // Measured alone: the warm pool's refill (after the previous phase's claims) and the last kill's reclaim are done.
  await agent.pool("base").filled();
  await driver.settled?.();
  while (driver.network.readyCount < 1) await sleep(5);
  const id = nextId();
  const t0 = performance.now();
  await agent.create({
    sandboxId: id,
    teamId: "bench",
    templateId: "base",
    envdAccessToken: "t",
    egress: OPEN,
    resources: { memoryMB: defaults.memoryMB - 1 },
  });
  cold.push(performance.now() - t0);
  await killTimed(id);
}
console.log(`create → envd ready, cold start:       ${fmt(cold)}`);

// Concurrent: CONCURRENT creates at once (pool first, then cold starts; network namespaces made as needed).
await agent.pool("base").filled();
while (driver.network.readyCount < 8) await sleep(5);
const ids = Array.from({ length: CONCURRENT }, nextId);
// The whole machine's busy CPU time (user, nice, system, irq, softirq, steal) in ms: what the burst costs the node.
const busyCpuMs = () => {
  const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) * 10;
};
const cpu0 = busyCpuMs();
const t0 = performance.now();
const results = await Promise.allSettled(
  ids.map(async (id) => {
    const start = performance.now();
    await agent.create({ sandboxId: id, teamId: "bench", templateId: "base", envdAccessToken: "t", egress: OPEN });
    return performance.now() - start;
  }),
);
const wall = performance.now() - t0;
const burstCpu = busyCpuMs() - cpu0;
const ok = results.filter((r) => r.status === "fulfilled").map((r) => r.value);
const failed = results.filter((r) => r.status === "rejected");
console.log(
  `${CONCURRENT} concurrent creates:               ${fmt(ok)}; failures ${failed.length}; wall ${wall.toFixed(0)} ms; machine CPU ${(burstCpu / CONCURRENT).toFixed(0)} ms per create`,
);
for (const f of failed.slice(0, 3)) console.log(`  failure: ${f.reason?.message ?? f.reason}`);

// Idle memory of the sandboxes just created (envd alone), after they settle.
await sleep(5000);
const memcg = [];
const pss = [];
for (const id of ids) {
  const sandbox = agent.get(id);
  if (!sandbox) continue;
  const stats = await agent.stats(id);
  memcg.push(stats.memoryUsageBytes / 2 ** 20);
  const procs = readFileSync(`/sys/fs/cgroup/pids/warren/${config.instance}/${sandbox.instanceId}/cgroup.procs`, "utf8")
    .split("\n")
    .filter(Boolean);
  let total = 0;
  for (const pid of procs) {
    const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
    total += Number(/^Pss:\s+(\d+) kB/m.exec(rollup)?.[1] ?? 0);
  }
  pss.push(total / 1024);
}
const mean = (values) => values.reduce((a, b) => a + b, 0) / values.length;
console.log(
  `idle sandbox memory (${memcg.length} sandboxes): memcg usage mean ${mean(memcg).toFixed(1)} MiB (p50 ${pct(memcg, 50).toFixed(1)}), PSS mean ${mean(pss).toFixed(1)} MiB (p50 ${pct(pss, 50).toFixed(1)})`,
);
const statLine = readFileSync(
  `/sys/fs/cgroup/memory/warren/${config.instance}/${agent.get(ids[0])?.instanceId}/memory.stat`,
  "utf8",
);
const field = (name) => Number(new RegExp(`^total_${name} (\\d+)$`, "m").exec(statLine)?.[1] ?? 0) / 2 ** 20;
console.log(
  `  one sandbox's memcg: rss ${field("rss").toFixed(1)} MiB, cache ${field("cache").toFixed(1)} MiB, shmem ${field("shmem").toFixed(1)} MiB`,
);

for (const id of ids) if (agent.get(id)) await killTimed(id);
console.log(
  `kill (route delete, every process SIGKILLed; mounts, cgroups, netns, veth, rules and files are reclaimed after it answers): ${fmt(teardown)}`,
);
await running.stop({ killAll: true });
process.exit(0);
