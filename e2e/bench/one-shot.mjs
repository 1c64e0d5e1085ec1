#!/usr/bin/env node
// A one-shot sandbox and a command round trip, side by side with podman on the same rootfs (issue 20): prints
// figures, asserts nothing. Run as root after `npm run build` (scripts/setup-host.sh installs podman):
//   node e2e/bench/one-shot.mjs [--runs N] [--env NAME=VALUE ...] [--separate-master]
// One node agent with the default configuration (`warren up`'s), driven with the official e2b SDK through the proxy.
// Interleaved, N runs each:
//   - Warren: Sandbox.create() → commands.run('true') → kill();
//   - podman: `podman run --rm --network none --rootfs <base>:O /bin/true` — the `base` template's rootfs under an
//     overlay (as a sandbox gets it), no network (a sandbox gets one: podman's side is the lighter job);
//   - a command round trip: commands.run('true') in a running sandbox vs `podman exec <container> true`.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";
import { clusterEnvFromArgs, clusterLayoutFromArgs } from "./cluster-args.mjs";

const run = promisify(execFile);
const runsArg = process.argv.indexOf("--runs");
const RUNS = runsArg > 0 ? Number(process.argv[runsArg + 1]) : 30;
const extraEnv = clusterEnvFromArgs();
const TEMPLATES = "/var/lib/warren/templates";

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
const stats = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return { p50: pct(sorted, 50), p99: pct(sorted, 99) };
};
const line = (label, times) => {
  const { p50, p99 } = stats(times);
  console.log(`${label.padEnd(52)} p50 ${p50.toFixed(1)} ms  p99 ${p99.toFixed(1)} ms  (n=${times.length})`);
};
const settle = () => new Promise((resolve) => setTimeout(resolve, 1000));
const timed = async (fn) => {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
};

/** The newest built `base` rootfs on this host (the node agent's template cache). */
function baseRootfs() {
  const built = readdirSync(TEMPLATES)
    .filter((name) => name.startsWith("base-") && existsSync(join(TEMPLATES, name, "READY")))
    .map((name) => join(TEMPLATES, name, "rootfs"));
  if (built.length === 0) throw new Error(`no built base template under ${TEMPLATES}`);
  return built.at(-1);
}

try {
  await run("podman", ["--version"]);
} catch {
  console.error("podman is missing: run scripts/setup-host.sh (it installs the benchmark's peers)");
  process.exit(2);
}

const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-oneshot-"));
const cluster = new LocalCluster({
  ...clusterLayoutFromArgs(),
  dataDir,
  nodeAgents: 1,
  instancePrefix: "os",
  nodeCidr: () => "10.235.0.0/22",
  onProgress: (text) => process.stderr.write(`  ${text}\n`),
  env: { ...QUIET_CLUSTER_ENV, ...extraEnv },
});
const podmanName = `warren-bench-${process.pid}`;
try {
  const env = await cluster.start();
  useClusterForSdk(env);
  const rootfs = baseRootfs();
  // Limits a sandbox has too, and within what this host lets root raise (podman's defaults ask for more).
  const limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"];
  const podmanRun = ["run", "--rm", "--network", "none", ...limits, "--rootfs", `${rootfs}:O`, "/bin/true"];
  // Warm both once (the SDK's first connection, podman's storage setup).
  await (await Sandbox.create()).kill();
  await run("podman", podmanRun);

  const warren = [];
  const phases = { create: [], command: [], kill: [] };
  const podman = [];
  // Each run starts on a quiet machine: the work one leaves behind (a warm pool's refill, a reclaim, podman's
  // cleanup) is not charged to the next one, whichever tool it is.
  for (let i = 0; i < RUNS; i++) {
    await settle();
    const t0 = performance.now();
    const sandbox = await Sandbox.create();
    const t1 = performance.now();
    await sandbox.commands.run("true");
    const t2 = performance.now();
    await sandbox.kill();
    const t3 = performance.now();
    warren.push(t3 - t0);
    phases.create.push(t1 - t0);
    phases.command.push(t2 - t1);
    phases.kill.push(t3 - t2);
    await settle();
    podman.push(await timed(() => run("podman", podmanRun)));
  }

  const sandbox = await Sandbox.create();
  await run("podman", [
    "run",
    "-d",
    "--name",
    podmanName,
    "--network",
    "none",
    ...limits,
    "--rootfs",
    `${rootfs}:O`,
    "sleep",
    "3600",
  ]);
  await sandbox.commands.run("true");
  await run("podman", ["exec", podmanName, "/bin/true"]);
  const warrenCommand = [];
  const podmanCommand = [];
  for (let i = 0; i < RUNS; i++) {
    warrenCommand.push(await timed(() => sandbox.commands.run("true")));
    podmanCommand.push(await timed(() => run("podman", ["exec", podmanName, "/bin/true"])));
  }
  await sandbox.kill();

  console.log(`Warren one-shot sandbox vs podman, ${new Date().toISOString()}, ${RUNS} runs each, interleaved`);
  line("Warren: create → commands.run('true') → kill", warren);
  line("  of which Sandbox.create()", phases.create);
  line("  of which the first commands.run('true')", phases.command);
  line("  of which kill()", phases.kill);
  line("podman run --rm --network none --rootfs base:O true", podman);
  console.log(`  ratio (p50): ${(stats(warren).p50 / stats(podman).p50).toFixed(2)} (target ≤ 0.25)`);
  line("Warren: commands.run('true') in a running sandbox", warrenCommand);
  line("podman exec <container> true", podmanCommand);
  console.log(`  ratio (p50): ${(stats(warrenCommand).p50 / stats(podmanCommand).p50).toFixed(2)}`);
} finally {
  await run("podman", ["rm", "-f", podmanName]).catch(() => undefined);
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}
