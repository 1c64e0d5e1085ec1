import { Sandbox } from "e2b";
import { afterAll, beforeAll, expect, it } from "vitest";
import {
  nextRouteEvent,
  RouteWriter,
  randomSandboxId,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
} from "./harness.js";

// The official SDK as the client, configured the way a single-origin Warren deployment is
// (E2B_SANDBOX_URL = the proxy, so it routes by E2b-Sandbox-Id/-Port headers). The "sandbox" is a
// tiny HTTP server that answers envd's /health with 204: the SDK's isRunning() is exactly
// "GET /health through the proxy is not 502".
let proxy: TestProxy;
let routes: RouteWriter;
let envdStandIn: Upstream;
const healthChecks: Array<{ sandboxId: string | undefined; port: string | undefined }> = [];

beforeAll(async () => {
  routes = new RouteWriter();
  envdStandIn = await startUpstream((req, res) => {
    if (req.method === "GET" && req.url === "/health") {
      healthChecks.push({
        sandboxId: req.headers["e2b-sandbox-id"] as string | undefined,
        port: req.headers["e2b-sandbox-port"] as string | undefined,
      });
      res.writeHead(204).end();
      return;
    }
    res.writeHead(404).end();
  });
  proxy = await startTestProxy();
});
afterAll(async () => {
  await proxy.close();
  await envdStandIn.close();
  await routes.cleanup();
});

function sdkSandbox(sandboxId: string): Sandbox {
  const SandboxClass = Sandbox as unknown as new (opts: Record<string, unknown>) => Sandbox;
  return new SandboxClass({ sandboxId, envdVersion: "0.4.0", sandboxUrl: proxy.url, debug: true });
}

it("the e2b SDK's isRunning() is true through the proxy, and false (502 JSON) once the route is deleted", async () => {
  const sandboxId = randomSandboxId();
  const route = await routes.write({
    sandboxId,
    sandboxAddr: "127.0.0.1",
    ports: { "49983": `127.0.0.1:${envdStandIn.port}` },
  });
  const sandbox = sdkSandbox(sandboxId);

  expect(await sandbox.isRunning()).toBe(true);
  expect(healthChecks.at(-1)).toEqual({ sandboxId, port: "49983" });

  const deleted = nextRouteEvent(proxy, (event) => event.sandboxId === sandboxId && event.state === "deleted");
  await routes.delete(sandboxId, route.exec);
  await deleted;
  const checks = healthChecks.length;
  expect(await sandbox.isRunning()).toBe(false);
  expect(healthChecks.length).toBe(checks); // answered by the proxy, not the sandbox
});

it("the e2b SDK gets isRunning() false for a sandbox the proxy never heard of", async () => {
  expect(await sdkSandbox(randomSandboxId()).isRunning()).toBe(false);
});
