#!/usr/bin/env node
// Pause / resume / snapshot / fork / move benchmarks (issue 7): prints figures, asserts nothing. Run as root
// after `npm run build`:   node e2e/bench/lifecycle.mjs [--quick]
// Starts its own cluster (two namespace node agents) in a temp dir and drives it with the official e2b SDK.
// Latencies are the SDK's round trips (api → master → node agent), as a client sees them.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { checkpointTier } from "../dist/host-capabilities.js";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const quick = process.argv.includes("--quick");
const N = quick ? 5 : 20;
const PAUSED = quick ? 10 : 50;
const CHECKPOINT_AFTER_MS = 1000;
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-life-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 2,
  poolSize: 2,
  instancePrefix: "x",
  nodeCidr: (i) => `10.223.${i * 16}.0/20`,
  onProgress: (line) => process.stderr.write(`  ${line}\n`),
  env: {
    ...QUIET_CLUSTER_ENV,
    WARREN_CHECKPOINT_AFTER_MS: String(CHECKPOINT_AFTER_MS),
    WARREN_MAX_SANDBOXES: "200",
  },
});

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
const ms = (n) => `${n.toFixed(1)} ms`;
const summary = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${ms(pct(sorted, 50))}  p99 ${ms(pct(sorted, 99))}  (n=${sorted.length})`;
};
const line = (label, text) => console.log(`${label.padEnd(52)} ${text}`);
const sleep = (msec) => new Promise((r) => setTimeout(r, msec));

async function timed(fn) {
  const t0 = performance.now();
  const value = await fn();
  return { value, ms: performance.now() - t0 };
}

/** MemAvailable of the host, MiB. */
function memAvailableMiB() {
  const match = /MemAvailable:\s+(\d+) kB/.exec(readFileSync("/proc/meminfo", "utf8"));
  return Number(match?.[1] ?? 0) / 1024;
}

/** pause → resume cycles on one sandbox; `settleMs` after each pause lets the agent convert to a checkpoint. */
async function pauseResume(sbx, settleMs, keepMemory = true) {
  const pauses = [];
  const resumes = [];
  for (let i = 0; i < N; i++) {
    pauses.push((await timed(() => sbx.pause({ keepMemory }))).ms);
    if (settleMs) await sleep(settleMs);
    resumes.push((await timed(() => sbx.connect())).ms);
    await sbx.commands.run("true");
  }
  return { pauses, resumes };
}

async function main() {
  const env = await cluster.start();
  useClusterForSdk(env);
  const tier = checkpointTier();
  console.log(`Warren pause/resume/snapshot benchmarks (${quick ? "quick" : "full"}), ${new Date().toISOString()}`);
  console.log(
    `two namespace node agents, official e2b SDK; checkpoint tier: ${tier.usable ? "CRIU works" : `unavailable (${tier.reason})`}\n`,
  );

  // Idle base sandbox: freezer tier (resume before the checkpoint delay).
  const idle = await Sandbox.create({ timeoutMs: 600_000 });
  await idle.commands.run("true");
  let r = await pauseResume(idle, 0);
  line("pause (memory), idle, freezer tier", summary(r.pauses));
  line("resume, idle, freezer tier", `${summary(r.resumes)}  (target p50 <= 50 ms)`);
  if (tier.usable) {
    r = await pauseResume(idle, CHECKPOINT_AFTER_MS + 1500);
    line("resume, idle, from a CRIU checkpoint on disk", `${summary(r.resumes)}  (target p50 <= 300 ms)`);
  }

  // 100 MB of dirty anonymous memory held by a process.
  const dirty = await Sandbox.create({ timeoutMs: 600_000 });
  await dirty.commands.run(
    `python3 -c "import time; b = bytearray(100 * 2**20)
for i in range(0, len(b), 4096): b[i] = 1
open('/tmp/ready', 'w').write('1'); time.sleep(3600)"`,
    { background: true },
  );
  for (let i = 0; i < 100; i++) {
    if ((await dirty.commands.run("test -e /tmp/ready && echo y || true")).stdout.trim() === "y") break;
    await sleep(100);
  }
  r = await pauseResume(dirty, 0);
  line("pause (memory), 100 MB dirty, freezer tier", `${summary(r.pauses)}  (target <= 50 ms + 1 ms/MB)`);
  line("resume, 100 MB dirty, freezer tier", summary(r.resumes));
  if (tier.usable) {
    r = await pauseResume(dirty, CHECKPOINT_AFTER_MS + 2500);
    line("resume, 100 MB dirty, from a CRIU checkpoint", summary(r.resumes));
  }
  await dirty.kill();

  // Filesystem-only pause: processes end; resume cold-starts over the kept disk.
  r = await pauseResume(idle, 0, false);
  line("pause (filesystem only)", summary(r.pauses));
  line("resume after a filesystem-only pause (reboot)", summary(r.resumes));

  // Snapshots: capture (the sandbox keeps running), create from one, fork.
  await idle.commands.run("dd if=/dev/urandom of=/home/user/blob bs=1M count=100 status=none", { user: "root" });
  const snaps = [];
  const snapshotIds = [];
  for (let i = 0; i < N; i++) {
    const t = await timed(() => idle.createSnapshot());
    snaps.push(t.ms);
    snapshotIds.push(t.value.snapshotId);
  }
  const kept = tier.usable ? "files + memory" : "files only";
  line(`createSnapshot, 100 MB written (${kept})`, summary(snaps));
  const fromSnap = [];
  for (let i = 0; i < N; i++) {
    const t0 = performance.now();
    const child = await Sandbox.create(snapshotIds[i % snapshotIds.length]);
    await child.commands.run("true");
    fromSnap.push(performance.now() - t0);
    await child.kill();
  }
  line("create from a snapshot → first commands.run", summary(fromSnap));
  const fork1 = [];
  const fork4 = [];
  for (let i = 0; i < Math.max(3, N / 4); i++) {
    let t = await timed(() => idle.fork({ count: 1, timeoutMs: 60_000 }));
    fork1.push(t.ms);
    await Promise.all(t.value.map((s) => (s instanceof Sandbox ? s.kill() : undefined)));
    t = await timed(() => idle.fork({ count: 4, timeoutMs: 60_000 }));
    fork4.push(t.ms);
    await Promise.all(t.value.map((s) => (s instanceof Sandbox ? s.kill() : undefined)));
  }
  line(`fork count 1 (100 MB written, ${kept})`, summary(fork1));
  line(`fork count 4 (100 MB written, ${kept})`, summary(fork4));
  for (const id of snapshotIds) await Sandbox.deleteSnapshot(id);

  // A filesystem-only paused sandbox moving to the other node (its node cordoned).
  const redis = new Redis(cluster.redisUrl);
  const moves = [];
  for (let i = 0; i < Math.max(3, N / 4); i++) {
    await idle.pause({ keepMemory: false });
    const from = await redis.hget(`warren:route:${idle.sandboxId}`, "node");
    await fetch(`${env.WARREN_API_URL}/warren/v1/admin/nodes/${from}/cordon`, {
      method: "POST",
      headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN },
    });
    moves.push((await timed(() => idle.connect())).ms);
    await fetch(`${env.WARREN_API_URL}/warren/v1/admin/nodes/${from}/cordon`, {
      method: "DELETE",
      headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN },
    });
  }
  redis.disconnect();
  line("resume on another node (100 MB written, fs-only)", summary(moves));
  await idle.kill();

  // Host memory of many paused sandboxes.
  const before = memAvailableMiB();
  const many = [];
  for (let i = 0; i < PAUSED; i++) many.push(await Sandbox.create({ timeoutMs: 600_000 }));
  await Promise.all(many.map((s) => s.commands.run("true")));
  const running = memAvailableMiB();
  for (const s of many) await s.pause();
  // Checkpoints run after the delay, many at once: wait until the host's free memory stops growing.
  await sleep(CHECKPOINT_AFTER_MS);
  let paused = memAvailableMiB();
  for (let i = 0; i < 60; i++) {
    await sleep(2000);
    const now = memAvailableMiB();
    if (now - paused < 4) break;
    paused = now;
  }
  line(
    `host memory, ${PAUSED} idle sandboxes`,
    `running ${((before - running) / PAUSED).toFixed(1)} MiB each; paused ${((before - paused) / PAUSED).toFixed(1)} MiB each (target: near zero)`,
  );
  await Promise.all(many.map((s) => s.kill().catch(() => false)));
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
