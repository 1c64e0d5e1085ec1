#!/usr/bin/env node
// Code-interpreter benchmarks (issue 6): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/code.mjs [--quick]
// Starts its own single-node cluster with a warm pool of code-interpreter-v1 sandboxes (gateway and kernels
// already started), drives it with the official @e2b/code-interpreter SDK through the proxy, and stops it.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox } from "@e2b/code-interpreter";
import { LocalCluster } from "@warren/local";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const quick = process.argv.includes("--quick");
const TEMPLATES = "base,code-interpreter-v1";
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-code-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 2,
  instancePrefix: "y",
  nodeCidr: () => "10.216.0.0/20",
  readyTemplates: TEMPLATES.split(","),
  env: {
    WARREN_PREBUILD_TEMPLATES: TEMPLATES,
    WARREN_POOL_TEMPLATES: TEMPLATES,
    ...QUIET_CLUSTER_ENV,
  },
  onProgress: (line) => process.stderr.write(`  ${line}\n`),
});

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const ms = (n) => `${n.toFixed(1)} ms`;
const summary = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${ms(pct(sorted, 50))}  p99 ${ms(pct(sorted, 99))}  (n=${sorted.length})`;
};

/** memcg usage of every sandbox cgroup of this node agent (cgroup v1 layout, instance tag "ya"). */
function sandboxMemcgMiB() {
  const root = "/sys/fs/cgroup/memory/warren/ya";
  try {
    return readdirSync(root, { withFileTypes: true })
      .filter((d) => d.isDirectory())
      .map((d) => Number(readFileSync(join(root, d.name, "memory.usage_in_bytes"), "utf8")) / 2 ** 20);
  } catch {
    return [];
  }
}

async function main() {
  const env = await cluster.start();
  useClusterForSdk(env);
  console.log(`Warren code-interpreter benchmarks (${quick ? "quick" : "full"}), ${new Date().toISOString()}`);
  console.log("one node agent, warm pool of 2 code-interpreter-v1 sandboxes, official SDK through the proxy\n");

  const firsts = [];
  for (let i = 0; i < (quick ? 3 : 10); i++) {
    const t0 = performance.now();
    const sandbox = await Sandbox.create();
    await sandbox.runCode("1+1");
    firsts.push(performance.now() - t0);
    await sandbox.kill();
    await new Promise((r) => setTimeout(r, 3000)); // let the pool refill (kernels start in about a second)
  }
  console.log(`create → first runCode result      ${summary(firsts)}  (target <= 1 s)`);

  // Back to back: each create claims a sandbox the pool started moments ago (a burst, an agent's loop).
  const burst = [];
  const claimedKernelWaits = [];
  for (let i = 0; i < (quick ? 6 : 20); i++) {
    const t0 = performance.now();
    const sandbox = await Sandbox.create();
    const created = performance.now();
    await sandbox.runCode("1+1");
    burst.push(performance.now() - t0);
    claimedKernelWaits.push(performance.now() - created);
    await sandbox.kill();
  }
  console.log(`back to back: create → first runCode ${summary(burst)}`);
  console.log(`back to back: the first runCode alone ${summary(claimedKernelWaits)}`);

  // The first execution in each language's default context after a create, against the second.
  for (const language of ["javascript", "typescript"]) {
    const first = [];
    const second = [];
    for (let i = 0; i < (quick ? 3 : 6); i++) {
      const sandbox = await Sandbox.create();
      let t0 = performance.now();
      await sandbox.runCode("1+1", { language });
      first.push(performance.now() - t0);
      t0 = performance.now();
      await sandbox.runCode("1+1", { language });
      second.push(performance.now() - t0);
      await sandbox.kill();
      await new Promise((r) => setTimeout(r, 3000));
    }
    console.log(`${language}: first runCode after a create ${summary(first)}, the second ${summary(second)}`);
  }

  const sandbox = await Sandbox.create();
  for (let i = 0; i < 10; i++) await sandbox.runCode("1+1");
  const warm = [];
  for (let i = 0; i < (quick ? 30 : 200); i++) {
    const t0 = performance.now();
    await sandbox.runCode("1+1");
    warm.push(performance.now() - t0);
  }
  console.log(`runCode('1+1'), warm python context ${summary(warm)}  (target p50 <= 10 ms)`);
  const usage = sandboxMemcgMiB();
  if (usage.length > 0) {
    const avg = usage.reduce((a, b) => a + b, 0) / usage.length;
    console.log(
      `memcg per code sandbox (gateway + python and javascript kernels + envd): ${avg.toFixed(1)} MiB (n=${usage.length})`,
    );
  }
  await sandbox.kill();
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
