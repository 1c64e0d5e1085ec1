#!/usr/bin/env node
// envd benchmarks: prints figures, asserts nothing. Run with `npm run bench` from the repo root
// (as root, after scripts/setup-host.sh). Everything talks to 127.0.0.1 only.
//
// Figures: commands.run('true') round trip (official e2b SDK) next to a bare local spawn of the
// same command line as a baseline; 100 concurrent runs; 1 GiB upload and download throughput with
// envd's peak RSS; idle RSS and PSS per process with ten envds running.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createReadStream, readFileSync, rmSync, statSync } from "node:fs";
import { open } from "node:fs/promises";
import { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Process } from "@warren/proto/process/process_pb";
import { Sandbox } from "e2b";

const MAIN = fileURLToPath(new URL("../dist/envd.cjs", import.meta.url));
const GiB = 1 << 30;
const args = new Set(process.argv.slice(2));
const quick = args.has("--quick");

function startEnvd() {
  const child = spawn(process.execPath, [MAIN, "--port", "0", "--default-user", "user"], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  return new Promise((resolve, reject) => {
    let log = "";
    child.stderr.on("data", (chunk) => {
      log += chunk;
      const match = /"msg":"envd listening".*"port":(\d+)/.exec(log);
      if (match) resolve({ child, url: `http://127.0.0.1:${match[1]}` });
    });
    child.once("exit", (code) => reject(new Error(`envd exited ${code}: ${log}`)));
  });
}

function stop(envd) {
  return new Promise((resolve) => {
    envd.child.once("exit", resolve);
    envd.child.kill("SIGTERM");
  });
}

function sandboxFor(envd) {
  return new Sandbox({ sandboxId: "bench", envdVersion: "0.6.4", sandboxUrl: envd.url, debug: true });
}

function statusKiB(pid, field) {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith(`${field}:`));
  return Number(line?.split(/\s+/)[1] ?? Number.NaN);
}

function pssKiB(pid) {
  const line = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8")
    .split("\n")
    .find((l) => l.startsWith("Pss:"));
  return Number(line?.split(/\s+/)[1] ?? Number.NaN);
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

const ms = (n) => `${n.toFixed(2)} ms`;
const mib = (kib) => `${(kib / 1024).toFixed(1)} MiB`;

async function roundTrip(sandbox, runs) {
  for (let i = 0; i < 20; i++) await sandbox.commands.run("true");
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await sandbox.commands.run("true");
    times.push(performance.now() - t0);
  }
  return times.sort((a, b) => a - b);
}

/** envd's own cost: Start of /bin/true as root over Connect, no login shell, no user switch. */
async function rawStart(envd, runs) {
  const client = createClient(Process, createConnectTransport({ baseUrl: envd.url, httpVersion: "1.1" }));
  const once = async () => {
    for await (const _ of client.start(
      { process: { cmd: "/bin/true" }, stdin: false },
      { headers: { authorization: "Basic cm9vdDo=" } },
    ));
  };
  for (let i = 0; i < 20; i++) await once();
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await once();
    times.push(performance.now() - t0);
  }
  return times.sort((a, b) => a - b);
}

function localSpawnBaseline(runs) {
  const uid = Number(spawnSync("id", ["-u", "user"]).stdout.toString().trim());
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    spawnSync("/usr/bin/setpriv", [
      `--reuid=${uid}`,
      `--regid=${uid}`,
      "--init-groups",
      "--",
      "/bin/bash",
      "-l",
      "-c",
      "true",
    ]);
    times.push(performance.now() - t0);
  }
  return times.sort((a, b) => a - b);
}

async function concurrent(sandbox, n) {
  const t0 = performance.now();
  const results = await Promise.allSettled(Array.from({ length: n }, (_, i) => sandbox.commands.run(`echo ${i}`)));
  const elapsed = performance.now() - t0;
  const ok = results.filter((r) => r.status === "fulfilled" && r.value.stdout === `${results.indexOf(r)}\n`).length;
  return { elapsed, ok };
}

async function makeSourceFile(path, bytes) {
  const handle = await open(path, "w");
  // Random bytes: a compressible file would be gzipped on the way down (the SDK's fetch asks for gzip),
  // which measures zlib, not envd.
  const block = randomBytes(8 << 20);
  for (let written = 0; written < bytes; written += block.length) await handle.write(block);
  await handle.close();
}

class PeakRss {
  constructor(pid) {
    this.pid = pid;
    this.peak = statusKiB(pid, "VmRSS");
    this.timer = setInterval(() => {
      this.peak = Math.max(this.peak, statusKiB(pid, "VmRSS"));
    }, 20);
  }
  stop() {
    clearInterval(this.timer);
    return this.peak;
  }
}

async function transfer(envd, sandbox, bytes) {
  const source = `/tmp/warren-bench-src-${process.pid}`;
  const target = `/home/user/warren-bench-${process.pid}.bin`;
  await makeSourceFile(source, bytes);
  const before = statusKiB(envd.child.pid, "VmRSS");
  let rss = new PeakRss(envd.child.pid);
  let t0 = performance.now();
  await sandbox.files.write(target, Readable.toWeb(createReadStream(source, { highWaterMark: 1 << 20 })));
  const upload = performance.now() - t0;
  const uploadPeak = rss.stop();
  const size = statSync(target).size;

  rss = new PeakRss(envd.child.pid);
  t0 = performance.now();
  const stream = await sandbox.files.read(target, { format: "stream" });
  let received = 0;
  for await (const chunk of stream) received += chunk.length;
  const download = performance.now() - t0;
  const downloadPeak = rss.stop();
  // The same transfer with curl as the client: the SDK's fetch costs CPU on these same two cores.
  const curl = (args) => spawnSync("curl", ["-s", "-o", "/dev/null", "-w", "%{time_total}", ...args]);
  const curlUp = curl([
    "-X",
    "POST",
    "-T",
    source,
    "-H",
    "Content-Type: application/octet-stream",
    `${envd.url}/files?path=${target}`,
  ]);
  const curlDown = curl([`${envd.url}/files?path=${target}`]);
  rmSync(source, { force: true });
  rmSync(target, { force: true });
  const seconds = (r) => (r.status === 0 ? Number(r.stdout.toString()) * 1000 : Number.NaN);
  return {
    size,
    received,
    upload,
    download,
    before,
    uploadPeak,
    downloadPeak,
    curlUpload: seconds(curlUp),
    curlDownload: seconds(curlDown),
  };
}

async function main() {
  const runs = quick ? 50 : 300;
  const transferBytes = quick ? 64 << 20 : GiB;
  console.log(`envd benchmarks (${quick ? "quick" : "full"}), node ${process.version}, ${new Date().toISOString()}`);

  const envd = await startEnvd();
  const sandbox = sandboxFor(envd);

  const rt = await roundTrip(sandbox, runs);
  const base = localSpawnBaseline(runs);
  console.log(`\ncommands.run('true') via e2b SDK, ${runs} runs (bash -l -c true as user):`);
  console.log(
    `  envd round trip     p50 ${ms(percentile(rt, 50))}  p99 ${ms(percentile(rt, 99))}  (target p50 <= 2 ms)`,
  );
  console.log(
    `  local spawnSync     p50 ${ms(percentile(base, 50))}  p99 ${ms(percentile(base, 99))}  (same argv, no envd: the floor)`,
  );

  const raw = await rawStart(envd, runs);
  console.log(
    `  Connect Start /bin/true as root  p50 ${ms(percentile(raw, 50))}  p99 ${ms(percentile(raw, 99))}  (envd alone: no login shell, no setpriv)`,
  );

  const c = await concurrent(sandbox, 100);
  console.log(`\n100 concurrent commands.run: ${c.ok}/100 correct, total ${ms(c.elapsed)}`);

  const t = await transfer(envd, sandbox, transferBytes);
  const mbps = (ms_) => (t.size / (1 << 20) / (ms_ / 1000)).toFixed(0);
  console.log(`\n${(t.size / (1 << 20)).toFixed(0)} MiB transfer (streamed, octet-stream upload):`);
  console.log(`  upload   ${mbps(t.upload)} MiB/s  (${ms(t.upload)})  envd peak RSS ${mib(t.uploadPeak)}`);
  console.log(`  download ${mbps(t.download)} MiB/s  (${ms(t.download)})  envd peak RSS ${mib(t.downloadPeak)}`);
  console.log(`  with curl as the client: upload ${mbps(t.curlUpload)} MiB/s, download ${mbps(t.curlDownload)} MiB/s`);
  console.log(
    `  envd RSS before transfer ${mib(t.before)}; received ${t.received} of ${t.size} bytes (target >= 300 MB/s, flat RSS)`,
  );
  await stop(envd);

  const fleet = await Promise.all(Array.from({ length: 10 }, () => startEnvd()));
  await Promise.all(fleet.map((e) => sandboxFor(e).commands.run("true")));
  await new Promise((r) => setTimeout(r, 1000));
  const rss = fleet.map((e) => statusKiB(e.child.pid, "VmRSS"));
  const pss = fleet.map((e) => pssKiB(e.child.pid));
  const avg = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  console.log(`\nidle envd (after one command), ten running:`);
  console.log(`  RSS per process ${mib(avg(rss))}   PSS per process ${mib(avg(pss))}  (target PSS <= 15 MB)`);
  await Promise.all(fleet.map(stop));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
