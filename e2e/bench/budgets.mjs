#!/usr/bin/env node
// Sandbox resource budgets (issue 18): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/budgets.mjs [--quick] [--mount-only]
// 1. The writable layer's mount step as the launcher runs it, interleaved, in a temp dir: tmpfs (before), an ext4
//    image made in the launcher (a sparse copy of a formatted image, loop-mounted with direct I/O: a create that
//    finds no ready disk), and a ready disk moved into place (the usual create).
// 2. A whole cluster (one namespace node agent) driven by the official e2b SDK:
//    - time from envd's death (kill -9 from the host) to the ledger's `sandbox.lost` and to the route's removal;
//    - a default sandbox's memory cgroup before and after a 700 MiB write, and where the bytes went.
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { routeKey } from "@warren/proto/redis";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const quick = process.argv.includes("--quick");
const N = quick ? 3 : 5;
const MOUNTS = quick ? 10 : 20;
const INSTANCE = "bqba";
const MiB = 1024 * 1024;
const line = (label, text) => console.log(`${label.padEnd(58)} ${text}`);
const sleep = (msec) => new Promise((r) => setTimeout(r, msec));
const mib = (bytes) => `${(bytes / MiB).toFixed(1)} MiB`;
const spread = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  const at = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))].toFixed(1);
  return `min ${at(0)}  p50 ${at(0.5)}  max ${at(1)} ms  (n=${sorted.length})`;
};

function mountStep() {
  const dir = mkdtempSync(join(tmpdir(), "warren-bench-disk-"));
  const image = join(dir, "ext4-1024m.img");
  execFileSync("mkfs.ext4", [
    "-q",
    "-F",
    "-m",
    "0",
    "-O",
    "^has_journal",
    "-E",
    "nodiscard,lazy_itable_init=1",
    image,
    "1024M",
  ]);
  const makeDisk = (img, mnt) => `cp --sparse=always "${image}" "${img}"
L=$(losetup --find --show --direct-io=on "${img}"); mount -o nodev,noatime,noinit_itable "$L" "${mnt}"; losetup -d "$L"`;
  const variants = {
    "tmpfs (size=1024m), before": `mount -t tmpfs -o size=1024m,mode=0755,nodev warren-disk "$D/disk"`,
    "ext4 image made in the launcher (no ready disk)": makeDisk("$D/disk.img", "$D/disk"),
    "ready ext4 disk moved into place (mount --move)": `mount --move "$D.ready" "$D/disk"`,
  };
  // What SandboxDisks does off the create path: a disk made ahead, mounted at `<dir>/ready/<id>`.
  const prepare = (d) => {
    mkdirSync(`${d}.ready`, { recursive: true });
    execFileSync("sh", ["-c", makeDisk(`${d}.img`, `${d}.ready`)]);
  };
  const times = Object.fromEntries(Object.keys(variants).map((name) => [name, { up: [], down: [] }]));
  try {
    for (let i = 0; i < MOUNTS; i++) {
      for (const [name, script] of Object.entries(variants)) {
        const d = join(dir, `sb${i}`);
        mkdirSync(join(d, "disk"), { recursive: true });
        if (name.startsWith("ready")) prepare(d);
        const t0 = performance.now();
        const run = spawnSync("sh", ["-c", `set -e; D="$1"\n${script}\nmkdir "$D/disk/upper" "$D/disk/work"`, "x", d]);
        if (run.status !== 0) throw new Error(`${name}: ${run.stderr}`);
        times[name].up.push(performance.now() - t0);
        const t1 = performance.now();
        execFileSync("umount", [join(d, "disk")]);
        rmSync(d, { recursive: true, force: true });
        rmSync(`${d}.ready`, { recursive: true, force: true });
        rmSync(`${d}.img`, { force: true });
        times[name].down.push(performance.now() - t1);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(
    "\nwritable layer mount step (one `sh -c` as the launcher runs it; load average now",
    readFileSync("/proc/loadavg", "utf8").split(" ")[0],
    ")",
  );
  for (const [name, t] of Object.entries(times)) {
    line(`  ${name}`, `mount ${spread(t.up)}`);
    line("", `umount + rm ${spread(t.down)}`);
  }
}

/** The node's instance id and directory of a sandbox. */
function instanceOf(dataDir, sandboxId) {
  const root = join(dataDir, `agent-${INSTANCE}`, "instances");
  for (const instanceId of readdirSync(root)) {
    const file = join(root, instanceId, "instance.json");
    if (!existsSync(file)) continue;
    const record = JSON.parse(readFileSync(file, "utf8"));
    if (record.labels.sandboxId === sandboxId) return { instanceId, dir: join(root, instanceId), pid: record.pid };
  }
  throw new Error(`no instance of ${sandboxId}`);
}

function memory(instanceId) {
  const dir = join("/sys/fs/cgroup/memory/warren", INSTANCE, instanceId);
  const stat = readFileSync(join(dir, "memory.stat"), "utf8");
  const field = (name) => Number(new RegExp(`^${name} (\\d+)$`, "m").exec(stat)?.[1] ?? 0);
  return {
    usage: Number(readFileSync(join(dir, "memory.usage_in_bytes"), "utf8")),
    rss: field("total_rss"),
    cache: field("total_cache"),
    shmem: field("total_shmem"),
    ooms: Number(/^oom_kill (\d+)$/m.exec(readFileSync(join(dir, "memory.oom_control"), "utf8"))?.[1] ?? 0),
  };
}

async function events(sandboxId) {
  const res = await fetch(`${process.env.E2B_API_URL}/warren/v1/sandboxes/${sandboxId}/events`, {
    headers: { "X-API-KEY": process.env.E2B_API_KEY },
  });
  return (await res.json()).events;
}

async function envdDeath(dataDir, redis) {
  const toLedger = [];
  const toRoute = [];
  for (let i = 0; i < N; i++) {
    const sandbox = await Sandbox.create();
    const { pid } = instanceOf(dataDir, sandbox.sandboxId);
    // PID 1 of the sandbox is tini; envd is its child.
    const envd = Number(readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/)[0]);
    const t0 = performance.now();
    process.kill(envd, "SIGKILL");
    let ledger;
    let route;
    while (ledger === undefined || route === undefined) {
      const now = performance.now() - t0;
      if (now > 60_000) break;
      if (route === undefined && (await redis.exists(routeKey(sandbox.sandboxId))) === 0) route = now;
      if (ledger === undefined && (await events(sandbox.sandboxId)).some((e) => e.type === "sandbox.lost"))
        ledger = performance.now() - t0;
      await sleep(20);
    }
    if (ledger !== undefined) toLedger.push(ledger);
    if (route !== undefined) toRoute.push(route);
    await sandbox.kill().catch(() => undefined);
  }
  console.log(
    "\nenvd killed with SIGKILL from the host (polled every 20 ms; node watchdog 2 s, then the master hears the route deleted)",
  );
  line("  → `sandbox.lost` in the ledger", toLedger.length ? spread(toLedger) : "never (60 s)");
  line("  → route removed from Redis", toRoute.length ? spread(toRoute) : "never (60 s)");
}

async function bigWrite(dataDir) {
  const sandbox = await Sandbox.create();
  try {
    const { instanceId, dir } = instanceOf(dataDir, sandbox.sandboxId);
    const before = memory(instanceId);
    const t0 = performance.now();
    const dd = await sandbox.commands.run("dd if=/dev/zero of=/home/user/big bs=1M count=700 2>&1 | tail -1; sync", {
      timeoutMs: 300_000,
    });
    const writeMs = performance.now() - t0;
    await sleep(1000);
    const after = memory(instanceId);
    const alive = (await sandbox.commands.run("echo ok")).stdout.trim();
    console.log("\na default sandbox writes 700 MiB as `user` (dd if=/dev/zero bs=1M count=700)");
    line("  dd", `${dd.stdout.trim()} (${(writeMs / 1000).toFixed(1)} s round trip)`);
    line("  memory cgroup usage before → after", `${mib(before.usage)} → ${mib(after.usage)}`);
    line("  of which anonymous (rss) before → after", `${mib(before.rss)} → ${mib(after.rss)}`);
    line("  of which shmem/tmpfs before → after", `${mib(before.shmem)} → ${mib(after.shmem)}`);
    line("  of which page cache (reclaimable) before → after", `${mib(before.cache)} → ${mib(after.cache)}`);
    line("  OOM kills in the sandbox", String(after.ooms));
    line(
      "  disk image on the host: size / allocated",
      `${mib(statSync(join(dir, "disk.img")).size)} / ${mib(statSync(join(dir, "disk.img")).blocks * 512)}`,
    );
    line("  sandbox answers afterwards", alive);
  } finally {
    await sandbox.kill();
  }
}

mountStep();
if (process.argv.includes("--mount-only")) process.exit(0);
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-budgets-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "bqb",
  nodeCidr: () => "10.229.16.0/22",
  onProgress: (text) => process.stderr.write(`  ${text}\n`),
  env: QUIET_CLUSTER_ENV,
});
let redis;
try {
  const env = await cluster.start();
  useClusterForSdk(env);
  redis = new Redis(cluster.redisUrl);
  await bigWrite(dataDir);
  await envdDeath(dataDir, redis);
} finally {
  redis?.disconnect();
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}
