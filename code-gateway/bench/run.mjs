#!/usr/bin/env node
// Code gateway benchmarks (figures printed, nothing asserted):
//   runCode('1+1') on a warm context, p50/p99, through the official @e2b/code-interpreter SDK
//   gateway process start → listening (default python + javascript kernels ready) → first result
//   gateway + idle kernels memory (RSS and PSS from /proc/<pid>/smaps_rollup)
// Run: npm run build && npm run bench -w code-gateway   (as root, like the tests)
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Sandbox } from "@e2b/code-interpreter";

const MAIN = fileURLToPath(new URL("../dist/main.js", import.meta.url));
const ITERATIONS = Number(process.env.BENCH_ITERATIONS ?? 500);

function startGateway() {
  const t0 = performance.now();
  const runtimeDir = join(tmpdir(), `wcg-bench-${process.pid}`);
  const child = spawn(process.execPath, [MAIN, "--port", "0"], {
    env: { ...process.env, CODE_GATEWAY_RUNTIME_DIR: runtimeDir, CODE_GATEWAY_ENVD_URL: "http://127.0.0.1:9" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  return new Promise((resolve, reject) => {
    child.stderr.on("data", (chunk) => {
      stderr += chunk;
      const match = /"msg":"code gateway listening".*"port":(\d+)/.exec(stderr);
      if (match) resolve({ child, port: Number(match[1]), listeningMs: performance.now() - t0, t0 });
    });
    child.once("exit", (code) => reject(new Error(`gateway exited ${code}: ${stderr}`)));
  });
}

function sdk(port) {
  return new Sandbox({ sandboxId: "bench", envdVersion: "0.6.4", sandboxUrl: `http://127.0.0.1:${port}`, debug: true });
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function latency(label, run) {
  for (let i = 0; i < 30; i++) await run();
  const samples = [];
  for (let i = 0; i < ITERATIONS; i++) {
    const t = performance.now();
    await run();
    samples.push(performance.now() - t);
  }
  samples.sort((a, b) => a - b);
  const f = (v) => `${v.toFixed(2)} ms`;
  console.log(
    `${label.padEnd(46)} p50 ${f(percentile(samples, 50))}  p90 ${f(percentile(samples, 90))}  p99 ${f(percentile(samples, 99))}  (n=${ITERATIONS})`,
  );
}

function treePids(pid) {
  const out = [pid];
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    const children = readFileSync(`/proc/${pid}/task/${task}/children`, "utf8").split(" ").filter(Boolean);
    for (const c of children) out.push(...treePids(Number(c)));
  }
  return out;
}

function memory(pid) {
  const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
  const kb = (name) => Number(new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(rollup)?.[1] ?? 0);
  const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean);
  const name = cmd.find((a) => /main\.js|js-kernel|ipykernel|bash_kernel|^\/bin\/bash$/.test(a)) ?? cmd[0];
  return { pid, name: name.split("/").pop(), rss: kb("Rss"), pss: kb("Pss") };
}

function printMemory(label, rootPid) {
  const rows = treePids(rootPid).map(memory);
  const mib = (kb) => `${(kb / 1024).toFixed(1)} MiB`;
  console.log(`${label}:`);
  for (const r of rows)
    console.log(
      `  ${r.name.padEnd(20)} pid ${String(r.pid).padEnd(8)} RSS ${mib(r.rss).padStart(10)}  PSS ${mib(r.pss).padStart(10)}`,
    );
  const total = rows.reduce((a, r) => ({ rss: a.rss + r.rss, pss: a.pss + r.pss }), { rss: 0, pss: 0 });
  console.log(`  ${"total".padEnd(29)} RSS ${mib(total.rss).padStart(10)}  PSS ${mib(total.pss).padStart(10)}`);
}

const gateway = await startGateway();
const sandbox = sdk(gateway.port);
const first = await sandbox.runCode("1+1");
const firstMs = performance.now() - gateway.t0;
if (first.text !== "2") throw new Error(`unexpected first result ${first.text}`);
console.log(`gateway start → listening (python + javascript kernels ready): ${gateway.listeningMs.toFixed(0)} ms`);
console.log(`gateway start → first runCode('1+1') result:                   ${firstMs.toFixed(0)} ms`);

await new Promise((r) => setTimeout(r, 1000));
printMemory("memory, gateway + 2 idle default kernels (python, javascript)", gateway.child.pid);

await latency("runCode('1+1') python, warm, SDK", () => sandbox.runCode("1+1"));
await latency("runCode('1+1') javascript, warm, SDK", () => sandbox.runCode("1+1", { language: "js" }));
const raw = `http://127.0.0.1:${gateway.port}/execute`;
await latency("POST /execute '1+1' python, warm, plain fetch", async () => {
  const res = await fetch(raw, { method: "POST", body: '{"code":"1+1"}' });
  await res.text();
});
await latency("runCode('1+1') python, env_vars {A:'1'}, SDK", () => sandbox.runCode("1+1", { envs: { A: "1" } }));

for (const language of ["python", "typescript", "bash"]) {
  const t = performance.now();
  const context = await sandbox.createCodeContext({ language });
  await sandbox.runCode(language === "bash" ? "echo 2" : "1+1", { context });
  console.log(`new ${language} context → first result: ${(performance.now() - t).toFixed(0)} ms`);
}
await new Promise((r) => setTimeout(r, 1000));
printMemory("memory, gateway + 5 idle kernels (python x2, javascript, typescript, bash)", gateway.child.pid);

const stopStart = performance.now();
const exited = new Promise((r) => gateway.child.once("exit", r));
gateway.child.kill("SIGTERM");
await exited;
console.log(`SIGTERM → gateway exited with 5 kernels shut down: ${(performance.now() - stopStart).toFixed(0)} ms`);
