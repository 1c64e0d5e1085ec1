#!/usr/bin/env node
// The first command after a create (issue 20), with and without the proxy opening a connection to the new
// sandbox's envd as soon as its route is written (PROXY_PREWARM_ENVD): prints figures, asserts nothing. Run as root
// after `npm run build`:
//   node e2e/bench/first-command.mjs [--runs N] [--rounds R]
// One node agent, official e2b SDK through the proxy. The two settings need two clusters (every proxy of a cluster
// sees every route, and a prewarm also readies envd itself), so each round starts one cluster with the prewarm on
// and one with it off, in turn, and in each: N creates (each after 1.5 s of quiet, so a pool's refill is not what
// is measured), timing a raw envd Start of `bash -l -c true` through the proxy, or the SDK's `commands.run('true')`,
// the first and the second time after the create.
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
};
const RUNS = arg("--runs", 15);
const ROUNDS = arg("--rounds", 2);

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
const summary = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${pct(sorted, 50).toFixed(1)} ms  p99 ${pct(sorted, 99).toFixed(1)} ms`;
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** One Connect server-streaming Start of `bash -l -c true` through the proxy, read to its end. */
function start(agent, proxy, sandbox) {
  const message = Buffer.from(JSON.stringify({ process: { cmd: "/bin/bash", args: ["-l", "-c", "true"] } }));
  const envelope = Buffer.alloc(5 + message.length);
  envelope.writeUInt32BE(message.length, 1);
  message.copy(envelope, 5);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: proxy.hostname,
        port: Number(proxy.port),
        agent,
        method: "POST",
        path: "/process.Process/Start",
        headers: {
          "Content-Type": "application/connect+json",
          "Connect-Protocol-Version": "1",
          "X-Access-Token": sandbox.envdAccessToken ?? "",
          "E2b-Sandbox-Id": sandbox.sandboxId,
          "E2b-Sandbox-Port": "49983",
        },
      },
      (res) => {
        res.resume();
        res.once("end", resolve);
      },
    );
    req.once("error", reject);
    req.end(envelope);
  });
}

const timed = async (fn) => {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
};

/** N creates in a cluster whose proxy has the prewarm `on` or not; appends to `into`. */
async function measure(prewarm, into) {
  const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-first-"));
  const cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    instancePrefix: "fc",
    nodeCidr: () => "10.209.0.0/22",
    onProgress: (line) => process.stderr.write(`  ${line}\n`),
    env: {
      ...QUIET_CLUSTER_ENV,
      PROXY_PREWARM_ENVD: prewarm ? "true" : "false",
    },
  });
  try {
    const env = await cluster.start();
    useClusterForSdk(env);
    const proxy = new URL(env.E2B_SANDBOX_URL);
    // The client's connections to the proxy stay open across sandboxes, as an SDK's do.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    await (await Sandbox.create()).kill();
    for (let i = 0; i < RUNS; i++) {
      for (const how of i % 2 ? ["raw", "sdk"] : ["sdk", "raw"]) {
        await sleep(1500);
        const sandbox = await Sandbox.create();
        const run = how === "raw" ? () => start(agent, proxy, sandbox) : () => sandbox.commands.run("true");
        into[`${how} first`].push(await timed(run));
        into[`${how} second`].push(await timed(run));
        await sandbox.kill();
      }
    }
    agent.destroy();
  } finally {
    await cluster.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

const empty = () => ({ "raw first": [], "raw second": [], "sdk first": [], "sdk second": [] });
const results = { on: empty(), off: empty() };
for (let round = 0; round < ROUNDS; round++) {
  for (const prewarm of round % 2 ? [false, true] : [true, false]) {
    await measure(prewarm, results[prewarm ? "on" : "off"]);
  }
}

console.log(
  `Warren: the first command after a create, the proxy's envd prewarm on / off, ${new Date().toISOString()}, ` +
    `${ROUNDS} rounds × ${RUNS} creates each`,
);
const labels = {
  "raw first": "envd Start through the proxy, first",
  "raw second": "envd Start through the proxy, second",
  "sdk first": "SDK commands.run('true'), first",
  "sdk second": "SDK commands.run('true'), second",
};
for (const [key, label] of Object.entries(labels)) {
  console.log(`${label.padEnd(40)} on: ${summary(results.on[key])}   off: ${summary(results.off[key])}`);
}
