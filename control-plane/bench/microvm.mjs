#!/usr/bin/env node
// microvm driver benchmark: template snapshot size, create-from-snapshot → envd ready (+ /init), pause (QMP stop),
// resume (cont), checkpoint to disk and resume from it, sandbox snapshot of a running guest and create from it
// (fork), host memory per idle guest, kill. Prints figures; asserts nothing. Run as root after `npm run build`: `node control-plane/bench/microvm.mjs`
// BENCH_ACCEL=kvm|tcg (default: kvm when the capability probe says a guest boots under KVM here, else tcg),
// BENCH_N (samples per figure, default 10), BENCH_IDLE (guests for the memory figure, default 3).
import { readFileSync, statSync } from "node:fs";
import { loadNodeAgentConfig } from "../dist/node-agent/config.js";
import { initEnvd } from "../dist/node-agent/envd-client.js";
import { createLogger } from "../dist/node-agent/log.js";
import { MicrovmDriver } from "../dist/runtime/microvm/driver.js";
import { ensureKernel } from "../dist/runtime/microvm/guest-image.js";
import { decideDriver, hostFacts, kvmBootTest } from "../dist/runtime/microvm/probe.js";
import { TemplateStore } from "../dist/templates/store.js";

const N = Number(process.env.BENCH_N ?? 10);
const IDLE = Number(process.env.BENCH_IDLE ?? 3);
const config = loadNodeAgentConfig({
  WARREN_NODE_ID: "bench-microvm",
  WARREN_STATE_DIR: "/var/lib/warren/bench-microvm",
  WARREN_INSTANCE: "bvm",
  WARREN_NET_CIDR: "10.237.0.0/20",
  WARREN_LOG_LEVEL: "warn",
});
const log = createLogger("bench", { level: "warn" });
const imageOptions = {
  dir: config.microvmDir,
  linuxDir: config.microvmKernel,
  busybox: "/bin/busybox",
  nodeBinary: config.nodeBinary,
  envdRoot: config.envdRoot,
  uidBase: config.uidBase,
};

let accel = process.env.BENCH_ACCEL;
if (!accel) {
  const probe = await decideDriver("auto", hostFacts(config.microvmKernel), async () =>
    kvmBootTest(await ensureKernel(imageOptions), config.microvmDir),
  );
  accel = probe.driver === "microvm" ? "kvm" : "tcg";
  console.log(`probe: ${probe.driver} (${probe.reasons.join("; ")}) → accel ${accel}`);
}

const pct = (values, p) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
};
const fmt = (values) =>
  `n=${values.length} min ${Math.min(...values).toFixed(1)} / median ${pct(values, 50).toFixed(1)} / max ${Math.max(...values).toFixed(1)} ms`;
const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
const time = async (fn) => {
  const started = performance.now();
  const value = await fn();
  return [performance.now() - started, value];
};

const templates = new TemplateStore({ dir: config.templatesDir, uidBase: config.uidBase, log });
const template = templates.ready("base");
if (!template) throw new Error("template 'base' is not built: run the node agent (or its tests) once first");
const driver = new MicrovmDriver({
  stateDir: config.stateDir,
  instance: config.instance,
  netCidr: config.netCidr,
  accel,
  imageDir: config.microvmDir,
  linuxDir: config.microvmKernel,
  nodeBinary: config.nodeBinary,
  envdRoot: config.envdRoot,
  uidBase: config.uidBase,
  readyTimeoutMs: 120_000,
  log,
});
await driver.start();
for (const instance of (await driver.reconcile()).adopted) await driver.kill(instance.instanceId);

const resources = template.recipe.defaults;
const [snapshotMs, snapshot] = await time(() => driver.ensureSnapshot(template, resources));
console.log(`accel: ${accel}; guest: ${resources.memoryMiB} MiB, ${Math.ceil(resources.cpuCount)} vCPU`);
console.log(
  `template snapshot: memory ${mib(statSync(snapshot.memory).size)}, disk layer ${mib(statSync(snapshot.disk).blocks * 512)} (${snapshotMs > 1000 ? `built in ${(snapshotMs / 1000).toFixed(1)} s` : "cached"})`,
);

const createMs = [];
const initMs = [];
const pauseMs = [];
const resumeMs = [];
for (let i = 0; i < N; i++) {
  const [ms, instance] = await time(() => driver.create({ template, resources }));
  const [init] = await time(() =>
    initEnvd(instance.envdUrl, {
      envVars: {},
      accessToken: "bench",
      defaultUser: "user",
      defaultWorkdir: "/home/user",
    }),
  );
  createMs.push(ms + init);
  initMs.push(init);
  const [p] = await time(() => driver.pause(instance.instanceId));
  const [r] = await time(() => driver.resume(instance.instanceId));
  pauseMs.push(p);
  resumeMs.push(r);
  await driver.kill(instance.instanceId);
}
console.log(`create from snapshot → envd ready, /init included: ${fmt(createMs)} (of which /init ${fmt(initMs)})`);
console.log(`pause (QMP stop): ${fmt(pauseMs)}`);
console.log(`resume (QMP cont + guest clock set): ${fmt(resumeMs)}`);

const checkpointMs = [];
const restoreMs = [];
const imageBytes = [];
const killMs = [];
for (let i = 0; i < Math.min(N, 5); i++) {
  const instance = await driver.create({ template, resources });
  await driver.pause(instance.instanceId);
  const [c, result] = await time(() => driver.checkpoint(instance.instanceId));
  checkpointMs.push(c);
  imageBytes.push(result.imageBytes);
  const [r] = await time(() => driver.resume(instance.instanceId));
  restoreMs.push(r);
  const [k] = await time(() => driver.kill(instance.instanceId));
  killMs.push(k);
}
console.log(
  `pause to disk (migrate memory + quit QEMU): ${fmt(checkpointMs)}; image ${mib(pct(imageBytes, 50))} median`,
);
console.log(`resume from disk (new QEMU -incoming + cont + envd): ${fmt(restoreMs)}`);
console.log(`kill (QEMU, netns, veth, files): ${fmt(killMs)}`);

// Sandbox snapshots: a running guest is stopped for the memory save and disk copy and runs on; a fork restores it
// into a new QEMU over a qcow2 layer on the snapshot's disk, then gets its own token from /init (presenting the
// source's, which the restored envd holds).
const snapMs = [];
const snapBytes = [];
const forkMs = [];
const forkInitMs = [];
const source = await driver.create({ template, resources });
const init = { envVars: {}, defaultUser: "user", defaultWorkdir: "/home/user" };
await initEnvd(source.envdUrl, { ...init, accessToken: "bench" });
for (let i = 0; i < Math.min(N, 5); i++) {
  const snapshotId = `bench-${process.pid}-${i}`;
  const [s, image] = await time(() => driver.snapshot(source.instanceId, snapshotId));
  snapMs.push(s);
  snapBytes.push(image.sizeBytes);
  const [f, fork] = await time(() => driver.create({ template, resources, snapshotId }));
  const [fi] = await time(() =>
    initEnvd(fork.envdUrl, { ...init, accessToken: `bench-${i}`, currentAccessToken: "bench" }),
  );
  forkMs.push(f + fi);
  forkInitMs.push(fi);
  await driver.kill(fork.instanceId);
  await driver.deleteSnapshot(snapshotId);
}
await driver.kill(source.instanceId);
console.log(
  `sandbox snapshot of a running guest (memory + disk copy): ${fmt(snapMs)}; ${mib(pct(snapBytes, 50))} median`,
);
console.log(
  `create from a sandbox snapshot → envd ready, /init included: ${fmt(forkMs)} (of which /init ${fmt(forkInitMs)})`,
);

const idle = [];
for (let i = 0; i < IDLE; i++) idle.push(await driver.create({ template, resources }));
await new Promise((resolve) => setTimeout(resolve, 5000));
const rss = [];
const pss = [];
for (const instance of idle) {
  const pid = Number(readFileSync(`${driver.instanceDir(instance.instanceId)}/qemu.pid`, "utf8"));
  const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
  rss.push(Number(/^Rss:\s+(\d+)/m.exec(rollup)[1]) * 1024);
  pss.push(Number(/^Pss:\s+(\d+)/m.exec(rollup)[1]) * 1024);
}
console.log(
  `host memory per idle guest (${IDLE} running, 5 s after create): RSS median ${mib(pct(rss, 50))}, PSS median ${mib(pct(pss, 50))}`,
);
for (const instance of idle) await driver.kill(instance.instanceId);
await driver.close();
