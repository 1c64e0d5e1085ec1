#!/usr/bin/env node
// Proxy benchmarks: prints figures, asserts nothing. `npm run bench -w proxy` (after `npx tsc --build`,
// as root after scripts/setup-host.sh installed nginx and wrk; needs Redis at 127.0.0.1:6379).
// Everything runs on 127.0.0.1.
//
// Side by side, at 1 and 32 connections (wrk, one thread, keep-alive): an origin answering a small
// body directly; nginx as a plain reverse proxy (upstream keep-alive, as usually configured);
// Warren's proxy (one process; one process with the route cache off; one worker per CPU); and the
// `http-proxy` package with its defaults and with a keep-alive agent (TOOLING.md's 7x figure).
// Then 1 GiB downloads and uploads through each proxy.
//
// Flags: --quick (2 s runs), --duration=SECONDS.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ROUTE_EVENTS_CHANNEL, routeKey, routeToHash, WRITE_ROUTE_SCRIPT } from "@warren/proto/redis";
import { Redis } from "ioredis";

const MAIN = fileURLToPath(new URL("../dist/main.js", import.meta.url));
const HTTP_PROXY_SERVER = fileURLToPath(new URL("./http-proxy-server.mjs", import.meta.url));
const args = process.argv.slice(2);
const quick = args.includes("--quick");
const duration = Number(args.find((a) => a.startsWith("--duration="))?.split("=")[1] ?? (quick ? 2 : 5));
const GiB = 1 << 30;
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

async function startNginx(name, body) {
  const dir = join(scratch, name);
  spawnSync("mkdir", ["-p", join(dir, "logs"), join(dir, "tmp")]);
  const conf = `user root;
worker_processes ${name === "origin" ? 1 : "auto"};
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
  const errors = /Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? "0";
  const socketErrors = /Socket errors: (.*)/.exec(out)?.[1];
  return { p50, p99, rps, errors: Number(errors), socketErrors };
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
  await startNginx(
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

  const nginxPort = await freePort();
  await startNginx(
    "reverse-proxy",
    `  upstream origin { server 127.0.0.1:${originPort}; keepalive 64; }
  upstream bulk { server 127.0.0.1:${bulkPort}; keepalive 64; }
  server {
    listen 127.0.0.1:${nginxPort};
    client_max_body_size 0;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    location /big { proxy_pass http://bulk; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
    location /sink { proxy_pass http://bulk; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_request_buffering off; }
  }`,
  );
  await waitForHttp(nginxPort);

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

  const startWarren = async (env) => {
    const { match } = await startChild(process.execPath, [MAIN], {
      name: "warren-proxy",
      env: { PROXY_HOST: "127.0.0.1", PROXY_PORT: "0", PROXY_METRICS_PORT: "off", PROXY_DOMAINS: "bench.test", ...env },
      ready: /"msg":"proxy listening".*?"port":(\d+)/,
    });
    const port = Number(match[1]);
    await waitForHttp(port, { Host: warrenHost });
    return port;
  };
  const startHttpProxy = async (mode) => {
    const { match } = await startChild(process.execPath, [HTTP_PROXY_SERVER, `http://127.0.0.1:${originPort}`, mode], {
      name: "http-proxy",
      ready: /^(\d+)\n/,
    });
    const port = Number(match[1]);
    await waitForHttp(port);
    return port;
  };

  const targets = [
    { name: "direct (origin)", port: originPort, headers: {} },
    { name: "nginx reverse proxy", port: nginxPort, headers: {} },
    { name: "warren, 1 process", port: await startWarren({ PROXY_WORKERS: "1" }), headers: { Host: warrenHost } },
    {
      name: "warren, 1 process, no route cache",
      port: await startWarren({ PROXY_WORKERS: "1", PROXY_ROUTE_CACHE_TTL_MS: "0" }),
      headers: { Host: warrenHost },
    },
    {
      name: `warren, ${cpuCount} workers`,
      port: await startWarren({ PROXY_WORKERS: String(cpuCount) }),
      headers: { Host: warrenHost },
    },
    { name: "http-proxy defaults", port: await startHttpProxy(""), headers: {} },
    { name: "http-proxy + keep-alive agent", port: await startHttpProxy("--agent"), headers: {} },
  ];

  const results = new Map();
  for (const connections of [1, 32]) {
    for (const target of targets) {
      wrk(target.port, connections, target.headers); // warm-up (JIT, pools)
      results.set(`${target.name}@${connections}`, wrk(target.port, connections, target.headers));
    }
  }

  const direct = (c) => results.get(`direct (origin)@${c}`);
  const nginx = (c) => results.get(`nginx reverse proxy@${c}`);
  const pad = (s, n) => String(s).padEnd(n);
  const num = (n, d = 3) => (Number.isFinite(n) ? n.toFixed(d) : "n/a");
  for (const connections of [1, 32]) {
    console.log(`\n## ${connections} connection${connections > 1 ? "s" : ""}`);
    console.log(
      `${pad("target", 36)}${pad("p50 ms", 9)}${pad("p99 ms", 9)}${pad("+p50 ms", 9)}${pad("+p99 ms", 9)}${pad("req/s", 10)}${pad("vs direct", 11)}${pad("vs nginx", 10)}errors`,
    );
    for (const target of targets) {
      const r = results.get(`${target.name}@${connections}`);
      console.log(
        pad(target.name, 36) +
          pad(num(r.p50), 9) +
          pad(num(r.p99), 9) +
          pad(num(r.p50 - direct(connections).p50), 9) +
          pad(num(r.p99 - direct(connections).p99), 9) +
          pad(Math.round(r.rps), 10) +
          pad(`${Math.round((100 * r.rps) / direct(connections).rps)}%`, 11) +
          pad(`${Math.round((100 * r.rps) / nginx(connections).rps)}%`, 10) +
          `${r.errors}${r.socketErrors ? ` (${r.socketErrors})` : ""}`,
      );
    }
  }

  console.log("\n## 1 GiB bodies, one connection (MiB/s)");
  console.log(`${pad("target", 36)}${pad("download", 12)}upload`);
  const bulkTargets = [
    { name: "direct (origin)", port: bulkPort, headers: {} },
    { name: "nginx reverse proxy", port: nginxPort, headers: {} },
    { name: "warren, 1 process", port: targets[2].port, headers: { Host: warrenBulkHost } },
  ];
  for (const target of bulkTargets) {
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
