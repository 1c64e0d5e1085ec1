#!/usr/bin/env node
// Where a command's time goes (issue 20): prints figures, asserts nothing. Run as root after `npm run build`:
//   node e2e/bench/command-path.mjs [--runs N]
// One node agent, one sandbox; each layer timed on `bash -l -c true` (what `commands.run('true')` runs), the
// layers interleaved round by round so a busy moment hits them all:
//   1. inside the sandbox: the login shell alone (a loop in a shell, as root and behind setpriv as `user`);
//   2. envd's Start, reached directly at the sandbox's address (a raw Connect request on a kept-alive socket), and
//      the same login shell behind the `prlimit` + `setpriv` chain envd used before its launcher;
//   3. the same request through the proxy (E2b-Sandbox-Id/-Port headers);
//   4. the official SDK's `commands.run('true')`, directly at envd and through the proxy.
// Beside each layer's latency, the CPU time envd, the proxy and this process (the client: a raw request, or the
// official SDK) spent per run (from /proc and process.cpuUsage, summed over the layer's runs): steadier than latency
// on a shared machine, and what a cheaper command path has to lower.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { routeFromHash, routeKey } from "@warren/proto/redis";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { QUIET_CLUSTER_ENV, useClusterForSdk } from "./bench-cluster.mjs";

const runsArg = process.argv.indexOf("--runs");
const RUNS = runsArg > 0 ? Number(process.argv[runsArg + 1]) : 40;
const dataDir = mkdtempSync(join(tmpdir(), "warren-bench-command-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  instancePrefix: "cp",
  nodeCidr: () => "10.231.0.0/22",
  onProgress: (line) => process.stderr.write(`  ${line}\n`),
  env: QUIET_CLUSTER_ENV,
});

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
const summary = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${pct(sorted, 50).toFixed(2)} ms  p99 ${pct(sorted, 99).toFixed(2)} ms  (n=${sorted.length})`;
};
const line = (label, text) => console.log(`${label.padEnd(44)} ${text}`);

/** CPU time (user + system, ms) a process has used so far. */
function cpuMs(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

function childrenOf(pid) {
  return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").split(" ").filter(Boolean).map(Number);
}

function cmdlineOf(pid) {
  return readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
}

/** envd's host pid: the sandbox's init (its instance record's pid) runs it as its child. */
function envdPid(sandboxId) {
  const root = join(dataDir, "agent-cpa", "instances");
  for (const instanceId of readdirSync(root)) {
    const file = join(root, instanceId, "instance.json");
    if (!existsSync(file)) continue;
    const record = JSON.parse(readFileSync(file, "utf8"));
    if (record.labels?.sandboxId !== sandboxId) continue;
    const envd = childrenOf(record.pid).find((pid) => cmdlineOf(pid).includes("envd.cjs"));
    if (envd !== undefined) return envd;
  }
  throw new Error(`envd of ${sandboxId} not found`);
}

/** The cluster's proxy: this process's child running the proxy's main. */
function proxyPid() {
  const pid = childrenOf(process.pid).find((child) => cmdlineOf(child).includes("proxy/dist/main.js"));
  if (pid === undefined) throw new Error("the proxy process was not found");
  return pid;
}

const LOGIN_TRUE = { cmd: "/bin/bash", args: ["-l", "-c", "true"] };
// The chain envd used before its launcher (native/warren-exec.c), started by root through the launcher: what the
// launcher saves per command is this layer's time less envd's own Start of the login shell.
const HELPER_CHAIN = {
  cmd: "/usr/bin/prlimit",
  args: [
    "--nproc=896:896",
    "--",
    "/usr/bin/setpriv",
    "--reuid=1000",
    "--regid=1000",
    "--init-groups",
    "--",
    "/bin/bash",
    "-l",
    "-c",
    "true",
  ],
};

/** One Connect server-streaming Start of `process` (`bash -l -c true` as the default user), read to its end. */
function start(agent, host, port, headers, process = LOGIN_TRUE) {
  const message = Buffer.from(JSON.stringify({ process, stdin: false }));
  const envelope = Buffer.alloc(5 + message.length);
  envelope.writeUInt32BE(message.length, 1);
  message.copy(envelope, 5);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host,
        port,
        agent,
        method: "POST",
        path: "/process.Process/Start",
        headers: { "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", ...headers },
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

async function main() {
  const env = await cluster.start();
  useClusterForSdk(env);
  const sandbox = await Sandbox.create({ timeoutMs: 600_000 });
  const redis = new Redis(cluster.redisUrl);
  const route = routeFromHash(await redis.hgetall(routeKey(sandbox.sandboxId)));
  redis.disconnect();
  const envdUrl = `http://${route.sandboxAddr}:49983`;
  const direct = await Sandbox.connect(sandbox.sandboxId, { sandboxUrl: envdUrl });
  const proxy = new URL(env.E2B_SANDBOX_URL);
  const auth = { "X-Access-Token": sandbox.envdAccessToken ?? "" };
  const directAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const proxyAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  // Let the pool's refill after this create end: it is not what this bench measures (bench:pools does).
  await new Promise((resolve) => setTimeout(resolve, 2000));

  console.log(`Warren: where a command's time goes, ${new Date().toISOString()}, ${RUNS} runs per layer`);
  const floor = await sandbox.commands.run(
    `t() { s=$(date +%s%N); for i in $(seq ${RUNS}); do "$@"; done; echo $(( ($(date +%s%N) - s) / ${RUNS} / 1000 )); }
     t bash -l -c true; t setpriv --reuid=1000 --regid=1000 --init-groups bash -l -c true`,
    { user: "root" },
  );
  const [asRoot, asUser] = floor.stdout.trim().split("\n").map(Number);
  line("in the sandbox: bash -l -c true (root)", `${(asRoot / 1000).toFixed(2)} ms (mean of a loop)`);
  line("in the sandbox: setpriv … bash -l (user)", `${(asUser / 1000).toFixed(2)} ms (mean of a loop)`);

  const layers = {
    "envd Start, direct": () => start(directAgent, route.sandboxAddr, 49983, auth),
    "envd Start of prlimit + setpriv + the same": () =>
      start(directAgent, route.sandboxAddr, 49983, { ...auth, Authorization: `Basic ${btoa("root:")}` }, HELPER_CHAIN),
    "envd Start, through the proxy": () =>
      start(proxyAgent, proxy.hostname, Number(proxy.port), {
        ...auth,
        "E2b-Sandbox-Id": sandbox.sandboxId,
        "E2b-Sandbox-Port": "49983",
      }),
    "SDK commands.run('true'), direct": () => direct.commands.run("true"),
    "SDK commands.run('true'), through the proxy": () => sandbox.commands.run("true"),
  };
  const times = Object.fromEntries(Object.keys(layers).map((name) => [name, []]));
  const cpu = Object.fromEntries(Object.keys(layers).map((name) => [name, { envd: 0, proxy: 0, client: 0 }]));
  const pids = { envd: envdPid(sandbox.sandboxId), proxy: proxyPid() };
  for (let i = 0; i < RUNS; i++) {
    for (const [name, run] of Object.entries(layers)) {
      const before = { envd: cpuMs(pids.envd), proxy: cpuMs(pids.proxy), client: process.cpuUsage() };
      const t0 = performance.now();
      await run();
      times[name].push(performance.now() - t0);
      const client = process.cpuUsage(before.client);
      cpu[name].client += (client.user + client.system) / 1000;
      cpu[name].envd += cpuMs(pids.envd) - before.envd;
      cpu[name].proxy += cpuMs(pids.proxy) - before.proxy;
    }
  }
  for (const [name, list] of Object.entries(times)) {
    const perRun = (ms) => (ms / list.length).toFixed(2);
    const { envd, proxy, client } = cpu[name];
    line(
      name,
      `${summary(list)}  CPU per run: envd ${perRun(envd)}, proxy ${perRun(proxy)}, client ${perRun(client)} ms`,
    );
  }
  directAgent.destroy();
  proxyAgent.destroy();
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
