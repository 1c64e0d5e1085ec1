#!/usr/bin/env node
// Durable state benchmarks (issue 21): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/durable.mjs [--quick]
// Starts its own cluster (four namespace node agents, the embedded store directory) and drives it with the
// official e2b SDK:
//  - pause → durable: from the pause call's return until the api reports `durable: true` (the leader's pass
//    captures the paused sandbox and publishes it to the store), for an idle sandbox and one with 100 MB written;
//  - resume after loss: the sandbox's node is removed for good (agent stopped, state folder deleted), then
//    `Sandbox.connect` until a command answers on another node (pull from the store + create from it);
//  - moves off a cordoned node, at once after the pause (node to node) and once it is durable (through the store);
//  - bytes moved: a sandbox of a custom template with a big step, paused twice; what each pause published to the
//    store (the template's layers are there already), and what the resume after loss pulled onto a node that has
//    the template (its own layers only). Read from the node agents' "snapshot published"/"snapshot pulled" logs.
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox, Template } from "e2b";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const quick = process.argv.includes("--quick");
const BIG_MB = quick ? 20 : 100;
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-durable-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 4,
  poolSize: 1,
  instancePrefix: "o",
  nodeCidr: (i) => `10.254.${i * 4}.0/22`,
  onProgress: (line) => process.stderr.write(`  ${line}\n`),
  env: {
    ...QUIET_CLUSTER_ENV,
    WARREN_RECONCILE_INTERVAL_MS: "500",
    WARREN_NODE_DOWN_AFTER_MS: "2000",
  },
});

const line = (label, text) => console.log(`${label.padEnd(56)} ${text}`);
const sleep = (msec) => new Promise((r) => setTimeout(r, msec));

let env;
async function api(path) {
  const res = await fetch(`${env.WARREN_API_URL}${path}`, { headers: { "X-API-KEY": env.E2B_API_KEY } });
  return res.json();
}

/** ms from now until the api says the paused sandbox is durable. */
async function untilDurable(sandboxId) {
  const t0 = performance.now();
  for (;;) {
    const detail = await api(`/sandboxes/${sandboxId}`);
    if (detail.durable === true) return performance.now() - t0;
    if (performance.now() - t0 > 300_000) throw new Error(`${sandboxId} never became durable`);
    await sleep(50);
  }
}

async function scenario(label, megabytes, nodeIndex, nodeId) {
  // Everything of this scenario starts on `nodeId`: the other live nodes are cordoned meanwhile.
  const others = ["node-oa", "node-ob", "node-oc", "node-od"].filter((n) => n !== nodeId);
  for (const other of others) await cluster.cordon(other, true);
  const sbx = await Sandbox.create("base", { timeoutMs: 600_000 });
  for (const other of others) await cluster.cordon(other, false);
  if ((await cluster.nodeOf(sbx.sandboxId)) !== nodeId) throw new Error(`${label}: not placed on ${nodeId}`);
  if (megabytes > 0) {
    await sbx.commands.run(`head -c ${megabytes}M /dev/urandom > /home/user/blob`, { timeoutMs: 120_000 });
  }
  const homeLog = logFrom(nodeId.replace(/^node-/, ""));
  await sbx.pause();
  const durableMs = await untilDurable(sbx.sandboxId);
  line(`pause → durable, ${label}`, `${durableMs.toFixed(0)} ms`);
  line("  of which publishing", `${homeLog.moved("snapshot published", "ms")} ms`);
  const logs = Object.fromEntries(others.map((n) => [n, logFrom(n.replace(/^node-/, ""))]));
  await cluster.removeNodeAgent(nodeIndex);
  const t0 = performance.now();
  const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 });
  const size = (await resumed.commands.run("stat -c %s /home/user/blob 2>/dev/null || echo 0")).stdout.trim();
  const resumeMs = performance.now() - t0;
  line(
    `resume on another node after loss, ${label}`,
    `${resumeMs.toFixed(0)} ms (on ${await cluster.nodeOf(sbx.sandboxId)}, blob ${Math.round(Number(size) / 2 ** 20)} MiB)`,
  );
  const target = logs[await cluster.nodeOf(sbx.sandboxId)];
  line(
    "  of which on the new node",
    `pull ${target.moved("snapshot pulled", "ms")} ms (import ${target.moved("snapshot imported", "ms")} ms)`,
  );
  await resumed.kill();
}

/**
 * A paused sandbox moved off a cordoned node (node `from` → node `to`), 100 MB written and a process running,
 * paused with its memory: at once (not durable yet: a snapshot streamed node to node) and once durable (the new
 * node pulls the published copy from the store).
 */
async function moves(from, to) {
  for (const waitDurable of [false, true]) {
    await cluster.cordon(to, true);
    const sbx = await Sandbox.create("base", { timeoutMs: 600_000 });
    await cluster.cordon(to, false);
    if ((await cluster.nodeOf(sbx.sandboxId)) !== from) throw new Error(`move: not placed on ${from}`);
    await sbx.commands.run(
      `head -c ${BIG_MB}M /dev/urandom > /home/user/blob; nohup sleep infinity >/dev/null 2>&1 &`,
      {
        timeoutMs: 120_000,
      },
    );
    await sbx.pause();
    if (waitDurable) await untilDurable(sbx.sandboxId);
    await cluster.cordon(from, true);
    const t0 = performance.now();
    const moved = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 });
    const check = (await moved.commands.run("stat -c %s /home/user/blob; pgrep -c -x sleep")).stdout.trim();
    const ms = performance.now() - t0;
    await cluster.cordon(from, false);
    const where = await cluster.nodeOf(sbx.sandboxId);
    line(
      `move off a cordoned node, ${BIG_MB} MB + a process, ${waitDurable ? "durable" : "at once (not durable)"}`,
      `${ms.toFixed(0)} ms (to ${where}; ${check.replace("\n", " bytes, sleep processes: ")})`,
    );
    await moved.kill();
  }
}

/** A node agent's log from now on: `moved(msg, field)` sums a field over the new lines with that message. */
function logFrom(instance) {
  const file = join(dataDir, "logs", `node-agent-${instance}.log`);
  const offset = statSync(file).size;
  return {
    moved(msg, field) {
      const text = readFileSync(file, "utf8").slice(offset);
      let total = 0;
      for (const row of text.split("\n")) {
        if (!row.includes(`"${msg}"`)) continue;
        total += Number(JSON.parse(row)[field] ?? 0);
      }
      return total;
    },
  };
}

const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

async function bytesMoved() {
  const TEMPLATE_MB = BIG_MB;
  const WRITE_MB = 10;
  // A start command: where CRIU works the ready snapshot keeps memory, which the sandbox's first copy is packed
  // against.
  const template = Template()
    .fromTemplate("base")
    .runCmd(`head -c ${TEMPLATE_MB}M /dev/urandom > /opt/big`, { user: "root" })
    .setStartCmd("sleep infinity", "true");
  await Template.build(template, "bench-durable-layers");
  const sbx = await Sandbox.create("bench-durable-layers", { timeoutMs: 600_000 });
  const home = await cluster.nodeOf(sbx.sandboxId);
  const other = ["node-oc", "node-od"].find((n) => n !== home);
  // The other node gets the template the way any node does: a create there pulls it.
  await cluster.cordon(home, true);
  await (await Sandbox.create("bench-durable-layers")).kill();
  await cluster.cordon(home, false);
  const homeLog = logFrom(home.replace(/^node-/, ""));
  await sbx.commands.run(`head -c ${WRITE_MB}M /dev/urandom > /home/user/first`, { timeoutMs: 120_000 });
  await sbx.pause();
  await untilDurable(sbx.sandboxId);
  const first = homeLog.moved("snapshot published", "uploadedBytes");
  line(`pause 1 → store (${TEMPLATE_MB} MB template, ${WRITE_MB} MB written)`, `${mib(first)} uploaded`);
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 });
  await sbx.commands.run("echo changed > /home/user/second");
  await sbx.pause();
  await untilDurable(sbx.sandboxId);
  const second = homeLog.moved("snapshot published", "uploadedBytes") - first;
  line("pause 2 → store (8 bytes more written)", `${mib(second)} uploaded`);
  const otherLog = logFrom(other.replace(/^node-/, ""));
  await cluster.removeNodeAgent(home.endsWith("c") ? 2 : 3);
  const t0 = performance.now();
  const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 });
  const check = (await resumed.commands.run("cat /home/user/second; stat -c %s /opt/big")).stdout.trim();
  line(
    "resume after loss on a node that has the template",
    `${(performance.now() - t0).toFixed(0)} ms, ${mib(otherLog.moved("snapshot pulled", "downloadedBytes"))} pulled (${check.replace("\n", ", ")})`,
  );
  await resumed.kill();
}

let ok = false;
try {
  env = await cluster.start();
  useClusterForSdk(env);
  console.log(`durable state, ${new Date().toISOString()}, store: the embedded OCI layout directory`);
  await scenario("idle sandbox", 0, 0, "node-oa");
  await scenario(`${BIG_MB} MB written`, BIG_MB, 1, "node-ob");
  await moves("node-oc", "node-od");
  await bytesMoved();
  ok = true;
} finally {
  await cluster.stop();
  // A failed run keeps its logs.
  if (ok) rmSync(dataDir, { recursive: true, force: true });
  else console.error(`logs in ${join(dataDir, "logs")}`);
}
