import { type ChildProcess, spawn } from "node:child_process";
import { type IncomingMessage, request } from "node:http";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RouteWriter, randomSandboxId, send, startUpstream, type Upstream, waitUntil } from "./harness.js";

const MAIN = fileURLToPath(new URL("../dist/main.js", import.meta.url));

interface ProxyProcess {
  readonly child: ChildProcess;
  readonly port: number;
  readonly metricsPort: number;
  logs(): string;
  exited: Promise<number | null>;
}

/** Runs the built entry point as its own process, configured only through the environment. */
async function spawnProxy(env: Record<string, string>): Promise<ProxyProcess> {
  const child = spawn(process.execPath, [MAIN], {
    env: {
      PATH: process.env.PATH ?? "",
      PROXY_HOST: "127.0.0.1",
      PROXY_PORT: "0",
      PROXY_METRICS_HOST: "127.0.0.1",
      PROXY_METRICS_PORT: "0",
      PROXY_DOMAINS: "warren.test",
      ...env,
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  await waitUntil(
    () => /"msg":"proxy listening"/.test(stderr) && /"msg":"metrics listening"/.test(stderr),
    `the proxy to start: ${stderr}`,
  );
  const port = Number(/"msg":"proxy listening".*?"port":(\d+)/.exec(stderr)![1]);
  const metricsPort = Number(/"msg":"metrics listening".*?"port":(\d+)/.exec(stderr)![1]);
  return { child, port, metricsPort, logs: () => stderr, exited };
}

async function metricsText(port: number): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`);
  return res.text();
}

let routes: RouteWriter;
let upstream: Upstream;
const release: Array<() => void> = [];

beforeAll(async () => {
  routes = new RouteWriter();
  upstream = await startUpstream((req, res) => {
    if (req.url === "/slow") {
      res.writeHead(200);
      res.write("started;");
      release.push(() => res.end("finished"));
      return;
    }
    res.end("ok");
  });
});
afterAll(async () => {
  await upstream.close();
  await routes.cleanup();
});

describe.each([
  ["one process", "1"],
  ["two cluster workers", "2"],
])("warren-proxy entry point (%s)", (_name, workers) => {
  it("serves sandbox traffic, exports Prometheus metrics, and on SIGTERM lets an in-flight stream finish before exiting 0", async () => {
    const proxy = await spawnProxy({ PROXY_WORKERS: workers });
    const sandboxId = randomSandboxId();
    await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "3000": `127.0.0.1:${upstream.port}` } });
    const host = `3000-${sandboxId}.warren.test`;
    expect((await send(proxy.port, { host })).body).toBe("ok");
    expect((await send(proxy.port, { host: `3000-${randomSandboxId()}.warren.test` })).status).toBe(502);

    const metrics = await metricsText(proxy.metricsPort);
    expect(metrics).toMatch(/warren_proxy_requests_total\{kind="http",status="200"\} 1/);
    expect(metrics).toMatch(/warren_proxy_requests_total\{kind="http",status="502"\} 1/);
    expect(metrics).toContain("warren_proxy_request_duration_seconds_bucket");
    expect(metrics).toContain("warren_proxy_route_lookups_total");
    expect(metrics).toContain("warren_proxy_open_websockets");

    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = request({ host: "127.0.0.1", port: proxy.port, path: "/slow", headers: { Host: host } }, resolve);
      req.on("error", reject);
      req.end();
    });
    let body = "";
    res.on("data", (chunk) => {
      body += chunk;
    });
    const ended = new Promise((resolve) => res.once("end", resolve));
    await waitUntil(() => body.length > 0, "the stream to start");

    proxy.child.kill("SIGTERM");
    await waitUntil(() => /"msg":"draining"/.test(proxy.logs()), "the proxy to start draining");
    release.shift()?.();
    await ended;
    expect(body).toBe("started;finished");
    expect(await proxy.exited).toBe(0);
    expect(proxy.logs()).not.toMatch(/"level":"error"/);
  });
});
