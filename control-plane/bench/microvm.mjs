#!/usr/bin/env node
// microvm driver benchmark: template snapshot size, create-from-snapshot → envd ready (+ /init), pause (QMP stop),
// resume (cont), checkpoint to disk and resume from it, sandbox snapshot of a running guest and create from it
// (fork), host memory per idle guest, kill. Prints figures; asserts nothing. Run as root after `npm run build`: `node control-plane/bench/microvm.mjs`
// BENCH_ACCEL=kvm|tcg (default: kvm when the capability probe says a guest boots under KVM here, else tcg),
// BENCH_N (samples per figure, default 10), BENCH_IDLE (guests for the memory figure, default 3), BENCH_MODES
// (`file,stream`, the default: template snapshots with guest RAM in a file mapped copy-on-write, and with RAM in
// the migration stream (WARREN_MICROVM_RAM_FILE=0), measured side by side, samples interleaved).
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
const MODES = (process.env.BENCH_MODES ?? "file,stream").split(",").map((mode, i) => {
  if (mode !== "file" && mode !== "stream") throw new Error(`BENCH_MODES: unknown mode '${mode}'`);
  const tag = `bv${i}`;
  return {
    label: mode === "file" ? "RAM file (copy-on-write)" : "RAM in stream",
    driver: new MicrovmDriver({
      stateDir: `/var/lib/warren/bench-microvm-${mode}`,
      instance: tag,
      netCidr: `10.237.${i * 16}.0/20`,
      accel,
      imageDir: config.microvmDir,
      linuxDir: config.microvmKernel,
      nodeBinary: config.nodeBinary,
      envdRoot: config.envdRoot,
      uidBase: config.uidBase,
      readyTimeoutMs: 120_000,
      templateRamFile: mode === "file",
      log,
    }),
  };
});
const resources = template.recipe.defaults;
console.log(`accel: ${accel}; guest: ${resources.memoryMB} MiB, ${Math.ceil(resources.cpuCount)} vCPU`);
for (const { label, driver } of MODES) {
  await driver.start();
  for (const instance of (await driver.reconcile()).adopted) await driver.kill(instance.instanceId);
  const [snapshotMs, snapshot] = await time(() => driver.ensureSnapshot(template, resources));
  const ram = snapshot.ram ? `, RAM file ${mib(statSync(snapshot.ram).blocks * 512)} allocated` : "";
  console.log(
    `[${label}] template snapshot: stream ${mib(statSync(snapshot.memory).size)}${ram}, disk layer ${mib(statSync(snapshot.disk).blocks * 512)} (${snapshotMs > 1000 ? `built in ${(snapshotMs / 1000).toFixed(1)} s` : "cached"})`,
  );
}

/** Per mode, per figure: samples. Samples of the modes are taken in turn, so load hits them alike. */
const samples = new Map(MODES.map(({ label }) => [label, {}]));
const record = (label, figure, value) => {
  const figures = samples.get(label);
  figures[figure] = [...(figures[figure] ?? []), value];
};
const report = (figure, describe = fmt) => {
  for (const { label } of MODES) {
    const values = samples.get(label)[figure];
    if (values) console.log(`[${label}] ${figure}: ${describe(values)}`);
  }
};
const init = { envVars: {}, defaultUser: "user", defaultWorkdir: "/home/user" };

for (let i = 0; i < N; i++) {
  for (const { label, driver } of MODES) {
    const [ms, instance] = await time(() => driver.create({ template, resources }));
    const [initMs] = await time(() => initEnvd(instance.envdUrl, { ...init, accessToken: "bench" }));
    record(label, "create from snapshot → envd ready, /init included", ms + initMs);
    record(label, "… of which /init", initMs);
    const [p] = await time(() => driver.pause(instance.instanceId));
    const [r] = await time(() => driver.resume(instance.instanceId));
    record(label, "pause (QMP stop)", p);
    record(label, "resume (QMP cont + guest clock set)", r);
    await driver.kill(instance.instanceId);
  }
}
report("create from snapshot → envd ready, /init included");
report("… of which /init");
report("pause (QMP stop)");
report("resume (QMP cont + guest clock set)");

for (let i = 0; i < Math.min(N, 5); i++) {
  for (const { label, driver } of MODES) {
    const instance = await driver.create({ template, resources });
    await driver.pause(instance.instanceId);
    const [c, result] = await time(() => driver.checkpoint(instance.instanceId));
    record(label, "pause to disk (migrate memory + quit QEMU)", c);
    record(label, "checkpoint image", result.imageBytes);
    const [r] = await time(() => driver.resume(instance.instanceId));
    record(label, "resume from disk (new QEMU -incoming + cont + envd)", r);
    const [k] = await time(() => driver.kill(instance.instanceId));
    record(label, "kill (QEMU, netns, veth, files)", k);
  }
}
report("pause to disk (migrate memory + quit QEMU)");
report("checkpoint image", (values) => `${mib(pct(values, 50))} median`);
report("resume from disk (new QEMU -incoming + cont + envd)");
report("kill (QEMU, netns, veth, files)");

// Sandbox snapshots: a running guest is stopped for the memory save and disk copy and runs on; a fork restores it
// into a new QEMU over a qcow2 layer on the snapshot's disk, then gets its own token from /init (presenting the
// source's, which the restored envd holds).
const sources = new Map();
for (const { label, driver } of MODES) {
  const source = await driver.create({ template, resources });
  await initEnvd(source.envdUrl, { ...init, accessToken: "bench" });
  sources.set(label, source);
}
for (let i = 0; i < Math.min(N, 5); i++) {
  for (const { label, driver } of MODES) {
    const source = sources.get(label);
    const snapshotId = `bench-${process.pid}-${i}`;
    const [s, image] = await time(() => driver.snapshot(source.instanceId, snapshotId));
    record(label, "sandbox snapshot of a running guest (memory + disk copy)", s);
    record(label, "sandbox snapshot size", image.sizeBytes);
    const [f, fork] = await time(() => driver.create({ template, resources, snapshotId }));
    const [fi] = await time(() =>
      initEnvd(fork.envdUrl, { ...init, accessToken: `bench-${i}`, currentAccessToken: "bench" }),
    );
    record(label, "create from a sandbox snapshot → envd ready, /init included", f + fi);
    await driver.kill(fork.instanceId);
    await driver.deleteSnapshot(snapshotId);
  }
}
for (const { label, driver } of MODES) await driver.kill(sources.get(label).instanceId);
report("sandbox snapshot of a running guest (memory + disk copy)");
report("sandbox snapshot size", (values) => `${mib(pct(values, 50))} median`);
report("create from a sandbox snapshot → envd ready, /init included");

// Memory: every mode's idle guests run at the same time, measured after the same wait.
const idle = [];
for (let i = 0; i < IDLE; i++) {
  for (const { label, driver } of MODES)
    idle.push({ label, driver, instance: await driver.create({ template, resources }) });
}
await new Promise((resolve) => setTimeout(resolve, 5000));
for (const { label, driver, instance } of idle) {
  const pid = Number(readFileSync(`${driver.instanceDir(instance.instanceId)}/qemu.pid`, "utf8"));
  const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
  record(label, "rss", Number(/^Rss:\s+(\d+)/m.exec(rollup)[1]) * 1024);
  record(label, "pss", Number(/^Pss:\s+(\d+)/m.exec(rollup)[1]) * 1024);
}
for (const { label } of MODES) {
  const { rss, pss } = samples.get(label);
  console.log(
    `[${label}] host memory per idle guest (${IDLE} per mode running, 5 s after create): RSS median ${mib(pct(rss, 50))}, PSS median ${mib(pct(pss, 50))}`,
  );
}
for (const { driver, instance } of idle) await driver.kill(instance.instanceId);
for (const { driver } of MODES) await driver.close();
