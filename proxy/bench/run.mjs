#!/usr/bin/env node
// Proxy benchmarks: prints figures, asserts nothing. `npm run bench -w proxy` (after `npx tsc --build`,
// as root after scripts/setup-host.sh installed nginx and wrk; needs Redis at 127.0.0.1:6379).
// Everything runs on 127.0.0.1.
//
// Side by side, at 1 and 32 connections (wrk, one thread, keep-alive): an origin answering a small
// body directly; nginx as a plain reverse proxy (upstream keep-alive, as usually configured) with one
// worker process and with one per CPU; Warren's proxy (one process; one process with the route cache
// off; one worker per CPU); and the `http-proxy` package with its defaults and with a keep-alive agent
// (TOOLING.md's 7x figure); and a minimal proxy on undici's client (undici-proxy-server.mjs: what
// replacing node:http's client alone would buy). Then 1 GiB downloads and uploads through each proxy.
//
// The box is shared (other tests, wrk and the origin compete for the same CPUs), so every target runs
// `--rounds` times, interleaved round-robin, and the tables show medians; "vs nginx" compares with the
// nginx row of the same process count, round by round. "CPU us/req" is the CPU time (user + system) of
// the target's processes divided by the requests it served: less sensitive to the load than req/s.
//
// Flags: --quick (2 s runs), --duration=SECONDS, --rounds=N (3), --baseline=PATH (another build's
// dist/main.js, e.g. a copy of the previous one, shown as "warren (baseline)" rows in the same run),
// --only=REGEX (measure only the proxies whose name matches, besides the origin and nginx),
// --no-bulk (skip the 1 GiB transfers).
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ROUTE_EVENTS_CHANNEL, routeKey, routeToHash, WRITE_ROUTE_SCRIPT } from "@warren/proto/redis";
import { Redis } from "ioredis";

const MAIN = fileURLToPath(new URL("../dist/main.js", import.meta.url));
const HTTP_PROXY_SERVER = fileURLToPath(new URL("./http-proxy-server.mjs", import.meta.url));
const UNDICI_PROXY_SERVER = fileURLToPath(new URL("./undici-proxy-server.mjs", import.meta.url));
const args = process.argv.slice(2);
const quick = args.includes("--quick");
const flag = (name) => args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
const duration = Number(flag("duration") ?? (quick ? 2 : 5));
const rounds = Number(flag("rounds") ?? 3);
const baseline = flag("baseline");
const only = flag("only") === undefined ? undefined : new RegExp(flag("only"));
const bulkTransfers = !args.includes("--no-bulk");
const GiB = 1 << 30;
const CLOCK_TICKS = Number(spawnSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).stdout.trim()) || 100;
const children = [];
const scratch = mkdtempSync(join(tmpdir(), "warren-proxy-bench-"));

function need(binary) {
  if (spawnSync("sh", ["-c", `command -v ${binary}`]).status !== 0) {
    console.error(`${binary} is not installed: run scripts/setup-host.sh (Debian packages nginx, wrk)`);
    process.exit(1);
  }
}

/** Starts a child and resolves with the first stdout/stderr match of `ready`. */
function startChild(command, argv, { env, ready, name }) {
  const child = spawn(command, argv, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  return new Promise((resolve, reject) => {
    let out = "";
    const onData = (chunk) => {
      out += chunk;
      const match = ready.exec(out);
      if (match) resolve({ child, match });
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.once("exit", (code) => reject(new Error(`${name} exited ${code}: ${out}`)));
  });
}

function freePort() {
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Starts nginx with `workers` worker processes ("auto": one per CPU); resolves with the master's process. */
async function startNginx(name, body, workers = 1) {
  const dir = join(scratch, name);
  spawnSync("mkdir", ["-p", join(dir, "logs"), join(dir, "tmp")]);
  const conf = `user root;
worker_processes ${workers};
daemon off;
pid ${dir}/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/tmp/body;
  proxy_temp_path ${dir}/tmp/proxy;
  fastcgi_temp_path ${dir}/tmp/fastcgi;
  uwsgi_temp_path ${dir}/tmp/uwsgi;
  scgi_temp_path ${dir}/tmp/scgi;
${body}
}
`;
  writeFileSync(join(dir, "nginx.conf"), conf);
  const child = spawn("nginx", ["-p", dir, "-c", join(dir, "nginx.conf"), "-e", "stderr"], { stdio: "inherit" });
  children.push(child);
  return child;
}

/** CPU time (user + system, ms) used so far by a process and its children (nginx or cluster workers). */
function cpuMs(pid) {
  const pids = [pid, ...spawnSync("pgrep", ["-P", String(pid)], { encoding: "utf8" }).stdout.split("\n")];
  let ticks = 0;
  for (const p of pids.filter(Boolean)) {
    try {
      // Fields after "(comm) ": state is the first, utime and stime the 12th and 13th (clock ticks).
      const fields = readFileSync(`/proc/${p}/stat`, "utf8").split(") ")[1].split(" ");
      ticks += Number(fields[11]) + Number(fields[12]);
    } catch {
      // exited meanwhile
    }
  }
  return (ticks * 1000) / CLOCK_TICKS;
}

function median(values) {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

async function waitForHttp(port, headers = {}) {
  for (let i = 0; i < 200; i++) {
    const ok = await new Promise((resolve) => {
      const req = request({ host: "127.0.0.1", port, headers, agent: false }, (res) => {
        res.resume();
        resolve(res.statusCode === 200);
      });
      req.on("error", () => resolve(false));
      req.end();
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`nothing answers 200 on ${port}`);
}

function toMs(text) {
  const m = /([\d.]+)(us|ms|s)/.exec(text);
  if (!m) return Number.NaN;
  const value = Number(m[1]);
  return m[2] === "us" ? value / 1000 : m[2] === "ms" ? value : value * 1000;
}

function wrk(port, connections, headers) {
  const argv = ["-t1", `-c${connections}`, `-d${duration}s`, "--latency"];
  for (const [k, v] of Object.entries(headers)) argv.push("-H", `${k}: ${v}`);
  argv.push(`http://127.0.0.1:${port}/`);
  const out = spawnSync("wrk", argv, { encoding: "utf8" }).stdout;
  const p50 = toMs(/\s50%\s+(\S+)/.exec(out)?.[1] ?? "");
  const p99 = toMs(/\s99%\s+(\S+)/.exec(out)?.[1] ?? "");
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? Number.NaN);
  const requests = Number(/(\d+) requests in/.exec(out)?.[1] ?? Number.NaN);
  const errors = /Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? "0";
  const socketErrors = /Socket errors: (.*)/.exec(out)?.[1];
  return { p50, p99, rps, requests, errors: Number(errors), socketErrors };
}

async function bodyTransfer(port, headers, direction) {
  const started = performance.now();
  await new Promise((resolve, reject) => {
    const req = request(
      {
        host: "127.0.0.1",
        port,
        method: direction === "download" ? "GET" : "PUT",
        path: direction === "download" ? "/big" : "/sink",
        headers: direction === "download" ? headers : { ...headers, "Content-Length": String(GiB) },
        agent: false,
      },
      (res) => {
        let bytes = 0;
        res.on("data", (chunk) => {
          bytes += chunk.length;
        });
        res.on("end", () =>
          direction === "download" && bytes !== GiB ? reject(new Error(`got ${bytes}`)) : resolve(),
        );
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    if (direction === "download") {
      req.end();
      return;
    }
    const chunk = randomBytes(1 << 20);
    let sent = 0;
    const pump = () => {
      while (sent < GiB) {
        sent += chunk.length;
        if (!req.write(chunk)) return req.once("drain", pump);
      }
      req.end();
    };
    pump();
  });
  return GiB / 2 ** 20 / ((performance.now() - started) / 1000);
}

async function main() {
  need("wrk");
  need("nginx");
  const cpuCount = cpus().length;
  console.log(
    `# warren proxy bench: ${cpuCount} CPUs, ${duration}s per run, wrk -t1, node ${process.version}, ` +
      `load average ${loadavg()
        .map((l) => l.toFixed(2))
        .join(" ")} (wrk, origin and proxies share these CPUs)`,
  );

  // Origin: nginx answering a fixed 13-byte body (fast enough that proxies, not the origin, are measured).
  const originPort = await freePort();
  const origin = await startNginx(
    "origin",
    `  server { listen 127.0.0.1:${originPort}; location / { return 200 "hello, world\\n"; } }`,
  );
  await waitForHttp(originPort);

  // Bulk origin: a Node server streaming 1 GiB, and a sink for uploads.
  const bulk = createServer((req, res) => {
    if (req.url === "/big") {
      const chunk = Buffer.alloc(1 << 20, 7);
      let sent = 0;
      res.writeHead(200, { "Content-Length": String(GiB) });
      const pump = () => {
        while (sent < GiB) {
          sent += chunk.length;
          if (!res.write(chunk)) return res.once("drain", pump);
        }
        res.end();
      };
      pump();
      return;
    }
    req.resume();
    req.on("end", () => res.end("ok"));
  });
  await new Promise((r) => bulk.listen(0, "127.0.0.1", r));
  const bulkPort = bulk.address().port;

  const startReverseProxy = async (name, workers) => {
    const port = await freePort();
    const child = await startNginx(
      name,
      `  upstream origin { server 127.0.0.1:${originPort}; keepalive 64; }
  upstream bulk { server 127.0.0.1:${bulkPort}; keepalive 64; }
  server {
    listen 127.0.0.1:${port};
    client_max_body_size 0;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    location /big { proxy_pass http://bulk; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
    location /sink { proxy_pass http://bulk; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_request_buffering off; }
  }`,
      workers,
    );
    await waitForHttp(port);
    return { port, pid: child.pid, headers: {} };
  };

  // The sandbox route Warren's proxy looks up: port 3000 -> origin, 3001 -> bulk origin.
  const redis = new Redis("redis://127.0.0.1:6379");
  const sandboxId = `ibench${randomBytes(8).toString("hex")}`.slice(0, 21);
  const route = {
    sandboxId,
    exec: "bench",
    generation: 1,
    node: "bench",
    nodeAddr: "127.0.0.1:1",
    sandboxAddr: "127.0.0.1",
    ports: { 3000: `127.0.0.1:${originPort}`, 3001: `127.0.0.1:${bulkPort}` },
    state: "running",
    team: "bench",
    public: true,
    trafficTokenHash: "",
    autoResume: false,
    maskRequestHost: "",
  };
  await redis.eval(
    WRITE_ROUTE_SCRIPT,
    1,
    routeKey(sandboxId),
    ROUTE_EVENTS_CHANNEL,
    "1",
    JSON.stringify({ sandboxId, exec: "bench", generation: 1, state: "running" }),
    ...Object.entries(routeToHash(route)).flat(),
  );
  const warrenHost = `3000-${sandboxId}.bench.test`;
  const warrenBulkHost = `3001-${sandboxId}.bench.test`;

  const startWarren = async (env, main = MAIN) => {
    const { child, match } = await startChild(process.execPath, [main], {
      name: "warren-proxy",
      env: { PROXY_HOST: "127.0.0.1", PROXY_PORT: "0", PROXY_METRICS_PORT: "off", PROXY_DOMAINS: "bench.test", ...env },
      ready: /"msg":"proxy listening".*?"port":(\d+)/,
    });
    const port = Number(match[1]);
    await waitForHttp(port, { Host: warrenHost });
    return { port, pid: child.pid, headers: { Host: warrenHost } };
  };
  const startHttpProxy = async (mode, server = HTTP_PROXY_SERVER) => {
    const { child, match } = await startChild(process.execPath, [server, `http://127.0.0.1:${originPort}`, mode], {
      name: "http-proxy",
      ready: /^(\d+)\n/,
    });
    const port = Number(match[1]);
    await waitForHttp(port);
    return { port, pid: child.pid, headers: {} };
  };

  // `procs`: processes serving requests, for the "vs nginx" column (nginx with as many workers).
  const candidates = [
    { name: "direct (origin)", procs: 1, start: async () => ({ port: originPort, pid: origin.pid, headers: {} }) },
    { name: "nginx, 1 worker", procs: 1, start: () => startReverseProxy("reverse-proxy-1", 1) },
    {
      name: `nginx, ${cpuCount} workers`,
      procs: cpuCount,
      start: () => startReverseProxy("reverse-proxy-n", cpuCount),
    },
    ...(baseline
      ? [
          {
            name: "warren (baseline), 1 process",
            procs: 1,
            start: () => startWarren({ PROXY_WORKERS: "1" }, baseline),
          },
          {
            name: `warren (baseline), ${cpuCount} workers`,
            procs: cpuCount,
            start: () => startWarren({ PROXY_WORKERS: String(cpuCount) }, baseline),
          },
        ]
      : []),
    { name: "warren, 1 process", procs: 1, start: () => startWarren({ PROXY_WORKERS: "1" }) },
    {
      name: "warren, 1 process, no route cache",
      procs: 1,
      start: () => startWarren({ PROXY_WORKERS: "1", PROXY_ROUTE_CACHE_TTL_MS: "0" }),
    },
    {
      name: `warren, ${cpuCount} workers`,
      procs: cpuCount,
      start: () => startWarren({ PROXY_WORKERS: String(cpuCount) }),
    },
    { name: "http-proxy defaults", procs: 1, start: () => startHttpProxy("") },
    { name: "http-proxy + keep-alive agent", procs: 1, start: () => startHttpProxy("--agent") },
    { name: "minimal undici proxy", procs: 1, start: () => startHttpProxy("", UNDICI_PROXY_SERVER) },
  ];
  const targets = [];
  for (const candidate of candidates) {
    const always = candidate.name.startsWith("direct") || candidate.name.startsWith("nginx");
    if (only && !always && !only.test(candidate.name)) continue;
    targets.push({ ...candidate, ...(await candidate.start()) });
  }
  const nginxFor = (procs) => (procs === 1 ? "nginx, 1 worker" : `nginx, ${cpuCount} workers`);

  const results = new Map();
  for (const connections of [1, 32]) {
    for (const target of targets) wrk(target.port, connections, target.headers); // warm-up (JIT, pools)
    for (let round = 0; round < rounds; round++) {
      for (const target of targets) {
        const cpuBefore = cpuMs(target.pid);
        const r = wrk(target.port, connections, target.headers);
        r.cpuUsPerRequest = ((cpuMs(target.pid) - cpuBefore) * 1000) / r.requests;
        const key = `${target.name}@${connections}`;
        results.set(key, [...(results.get(key) ?? []), r]);
      }
    }
  }

  const pad = (s, n) => String(s).padEnd(n);
  const num = (n, d = 3) => (Number.isFinite(n) ? n.toFixed(d) : "n/a");
  const pct = (n) => (Number.isFinite(n) ? `${Math.round(100 * n)}%` : "n/a");
  for (const connections of [1, 32]) {
    const runs = (name) => results.get(`${name}@${connections}`);
    const med = (name, field) => median(runs(name).map((r) => r[field]));
    // Round by round, so a burst of load from elsewhere hits both sides of a ratio alike.
    const ratio = (name, other) => median(runs(name).map((r, i) => r.rps / runs(other)[i].rps));
    console.log(
      `\n## ${connections} connection${connections > 1 ? "s" : ""} (medians of ${rounds} interleaved rounds)`,
    );
    console.log(
      `${pad("target", 38)}${pad("p50 ms", 9)}${pad("p99 ms", 9)}${pad("+p50 ms", 9)}${pad("req/s", 9)}${pad("vs direct", 11)}${pad("vs nginx", 10)}${pad("CPU us/req", 12)}errors`,
    );
    for (const target of targets) {
      const errors = runs(target.name).reduce((sum, r) => sum + r.errors, 0);
      const socketErrors = runs(target.name).find((r) => r.socketErrors)?.socketErrors;
      console.log(
        pad(target.name, 38) +
          pad(num(med(target.name, "p50")), 9) +
          pad(num(med(target.name, "p99")), 9) +
          pad(num(med(target.name, "p50") - med("direct (origin)", "p50")), 9) +
          pad(Math.round(med(target.name, "rps")), 9) +
          pad(pct(ratio(target.name, "direct (origin)")), 11) +
          pad(target.name === "direct (origin)" ? "" : pct(ratio(target.name, nginxFor(target.procs))), 10) +
          pad(num(med(target.name, "cpuUsPerRequest"), 1), 12) +
          `${errors}${socketErrors ? ` (${socketErrors})` : ""}`,
      );
    }
  }

  if (!bulkTransfers) {
    await redis.del(routeKey(sandboxId));
    await redis.quit();
    bulk.close();
    return;
  }
  console.log("\n## 1 GiB bodies, one connection (MiB/s)");
  console.log(`${pad("target", 36)}${pad("download", 12)}upload`);
  const bulkTargets = [
    { name: "direct (origin)", port: bulkPort, headers: {} },
    { name: "nginx, 1 worker", port: targets[1].port, headers: {} },
    {
      name: "warren, 1 process",
      port: targets.find((t) => t.name === "warren, 1 process")?.port,
      headers: { Host: warrenBulkHost },
    },
  ];
  for (const target of bulkTargets.filter((t) => t.port !== undefined)) {
    const down = await bodyTransfer(target.port, target.headers, "download");
    const up = await bodyTransfer(target.port, target.headers, "upload");
    console.log(`${pad(target.name, 36)}${pad(Math.round(down), 12)}${Math.round(up)}`);
  }

  await redis.del(routeKey(sandboxId));
  await redis.quit();
  bulk.close();
}

function cleanup() {
  for (const child of children) if (child.exitCode === null) child.kill("SIGTERM");
  rmSync(scratch, { recursive: true, force: true });
}

main().then(
  () => {
    cleanup();
    process.exit(0);
  },
  (error) => {
    console.error(error);
    cleanup();
    process.exit(1);
  },
);
