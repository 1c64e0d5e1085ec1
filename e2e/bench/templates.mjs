#!/usr/bin/env node
// Template build benchmarks (issue 17): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/templates.mjs [--quick]
// Starts its own cluster (two namespace node agents, the template store on a loopback docker-registry) in a temp
// dir and drives it with the official e2b SDK: a cold five-step build, the same build fully cached, create from a
// custom template → first command side by side with `base`, a template's first pull onto another node, and what
// the step layers of a build whose first step writes BIG_MB take on the node's disk and in the store (from the
// node agents' "sandbox snapshotted" and "snapshot published" logs).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox, Template } from "e2b";
import { Redis } from "ioredis";
import { startRegistry } from "../dist/registry.js";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const quick = process.argv.includes("--quick");
const N = quick ? 5 : 20;
const BIG_MB = quick ? 50 : 300;
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-tpl-"));
const contextDir = join(dataDir, "context");

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const ms = (n) => `${n.toFixed(0)} ms`;
const stats = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return { p50: pct(sorted, 50), p99: pct(sorted, 99), n: sorted.length };
};
const fmt = (s) => `p50 ${ms(s.p50)}  p99 ${ms(s.p99)}  (n=${s.n})`;
const line = (label, text) => console.log(`${label.padEnd(58)} ${text}`);

async function timed(fn) {
  const t0 = performance.now();
  const value = await fn();
  return { value, ms: performance.now() - t0 };
}

function fiveSteps(stamp) {
  return Template({ fileContextPath: contextDir })
    .fromTemplate("base")
    .runCmd(`echo ${stamp} > /opt/stamp && python3 -c 'print(sum(range(10**6)))'`, { user: "root" })
    .copy("app.py", "/app/", { user: "user" })
    .setEnvs({ APP_MODE: "bench" })
    .setWorkdir("/app")
    .runCmd("python3 -m py_compile app.py", { user: "root" });
}

async function createAndRun(template) {
  const t0 = performance.now();
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000 });
  await sbx.commands.run("true");
  const elapsed = performance.now() - t0;
  await sbx.kill();
  return elapsed;
}

/** What the node agents log from now on: `sum(msg, field)` adds a field over the new lines with that message. */
function agentLogs(instances) {
  const files = instances.map((i) => join(dataDir, "logs", `node-agent-${i}.log`));
  const offsets = files.map((file) => statSync(file).size);
  return {
    sum(msg, field) {
      let total = 0;
      files.forEach((file, i) => {
        for (const row of readFileSync(file, "utf8").slice(offsets[i]).split("\n")) {
          if (row.includes(`"${msg}"`)) total += Number(JSON.parse(row)[field] ?? 0);
        }
      });
      return total;
    },
  };
}

async function nodeOf(cluster, sandboxId) {
  const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
  try {
    return (await redis.hget(`warren:route:${sandboxId}`, "node")) ?? "";
  } finally {
    redis.disconnect();
  }
}

async function main() {
  const registry = await startRegistry(join(dataDir, "registry"));
  const cluster = new LocalCluster({
    dataDir,
    nodeAgents: 2,
    poolSize: 2,
    instancePrefix: "q",
    nodeCidr: (i) => `10.232.${i * 16}.0/20`,
    onProgress: (text) => process.stderr.write(`  ${text}\n`),
    env: {
      ...QUIET_CLUSTER_ENV,
      WARREN_STORE: `docker://${registry.host}/bench`,
      WARREN_STORE_INSECURE: "1",
    },
  });
  try {
    const env = await cluster.start();
    useClusterForSdk(env);
    mkdirSync(contextDir, { recursive: true });
    writeFileSync(join(contextDir, "app.py"), "print('hello')\n");
    console.log(`Warren template benchmarks (${quick ? "quick" : "full"}), ${new Date().toISOString()}`);
    console.log("two namespace node agents, store on a loopback docker-registry, official e2b SDK\n");

    const cold = await timed(() => Template.build(fiveSteps("cold"), "bench-five"));
    line("cold build, five steps (from base)", ms(cold.ms));
    const cached = [];
    for (let i = 0; i < (quick ? 3 : 5); i++)
      cached.push((await timed(() => Template.build(fiveSteps("cold"), "bench-five"))).ms);
    line("the same build, every step cached (target ≤ 2 s)", fmt(stats(cached)));
    const oneChanged = await timed(() => Template.build(fiveSteps("changed"), "bench-five"));
    line("first step changed (all five rerun)", ms(oneChanged.ms));

    // Create → first command, custom template and base interleaved in the same run.
    const custom = [];
    const base = [];
    for (let i = 0; i < N; i++) {
      base.push(await createAndRun("base"));
      custom.push(await createAndRun("bench-five"));
    }
    const c = stats(custom);
    const b = stats(base);
    line("create → first command, base", fmt(b));
    line("create → first command, custom five-step template", fmt(c));
    line("ratio custom / base, p50 (target ≤ 1.2)", (c.p50 / b.p50).toFixed(2));

    // A template of BIG_MB, built on one node, first started on the other (pulled from the registry).
    const big = Template().fromTemplate("base").runCmd(`head -c ${BIG_MB}M /dev/urandom > /opt/big`, { user: "root" });
    const built = await timed(() => Template.build(big, "bench-big"));
    line(`build of a ${BIG_MB} MB template (publish included)`, ms(built.ms));
    const first = await Sandbox.create("bench-big", { timeoutMs: 300_000 });
    const home = await nodeOf(cluster, first.sandboxId);
    await first.kill();
    const other = home.endsWith("a") ? home.replace(/a$/, "b") : home.replace(/b$/, "a");
    const cordon = (node, on) =>
      fetch(`${env.WARREN_API_URL}/warren/v1/admin/nodes/${node}/cordon`, {
        method: on ? "POST" : "DELETE",
        headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN },
      });
    await cordon(home, true);
    const pulled = await timed(() => createAndRun("bench-big"));
    const again = await timed(() => createAndRun("bench-big"));
    await cordon(home, false);
    line(`first create on ${other}: pull ${BIG_MB} MB + create + command`, ms(pulled.ms));
    line(`second create there (copy cached)`, ms(again.ms));

    // Three steps after one that writes BIG_MB: each later step's layer holds only what it changed.
    const logs = agentLogs(["qa", "qb"]);
    const layered = Template()
      .fromTemplate("base")
      .runCmd(`head -c ${BIG_MB}M /dev/urandom > /opt/first`, { user: "root" })
      .runCmd("echo 2 > /opt/second", { user: "root" })
      .runCmd("echo 3 > /opt/third", { user: "root" })
      .runCmd("echo 4 > /opt/fourth", { user: "root" });
    const layeredBuild = await timed(() => Template.build(layered, "bench-layers"));
    const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
    line(`build: a ${BIG_MB} MB step + 3 small steps (publish included)`, ms(layeredBuild.ms));
    line(
      "  its snapshots on the node (4 step layers + the ready one)",
      `${logs.sum("sandbox snapshotted", "sizeMiB").toFixed(1)} MiB`,
    );
    line("  moved to the store by its publishes", mib(logs.sum("snapshot published", "uploadedBytes")));
  } finally {
    await cluster.stop();
    await registry.process.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((error) => {
  console.error(error instanceof Error ? `${error.name}: ${error.message}` : error);
  process.exit(1);
});
