import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  RouteWriter,
  randomSandboxId,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
} from "../../proxy/test/harness.js";
import { Sandbox, TimeoutError } from "../src/index.js";
import {
  json,
  type RecordingServer,
  scratch,
  startEnvd,
  startRecordingServer,
  type TestEnvd,
  until,
} from "./harness.js";

// Warren's SDK through the real proxy, configured as a self-hosted deployment without wildcard DNS:
// `sandboxUrl` is the proxy and every request names its sandbox with E2b-Sandbox-Id/-Port headers.
let envd: TestEnvd;
let proxy: TestProxy;
let routes: RouteWriter;
let api: RecordingServer;
let web: Upstream;
const TOKEN = "proxy-token";

beforeAll(async () => {
  envd = await startEnvd({ accessToken: TOKEN });
  routes = new RouteWriter();
  proxy = await startTestProxy({ PROXY_DRAIN_TIMEOUT_MS: "200" });
  api = await startRecordingServer();
  web = await startUpstream((req, res) => {
    res.writeHead(200, { "Content-Type": "text/plain" }).end(`web ${req.url} ${req.headers["e2b-sandbox-port"]}`);
  });
});
afterAll(async () => {
  await proxy?.close();
  await web?.close();
  await api?.close();
  await routes?.cleanup();
  await envd?.stop();
});

async function routedSandbox(proxyUrl: string): Promise<{ sandbox: Sandbox; exec: string; sandboxId: string }> {
  const sandboxId = randomSandboxId();
  const route = await routes.write({
    sandboxId,
    sandboxAddr: "127.0.0.1",
    ports: { "49983": `127.0.0.1:${envd.port}`, "8080": `127.0.0.1:${web.port}` },
  });
  api.handle((_req, res) =>
    json(res, 200, {
      sandboxID: sandboxId,
      templateID: "base",
      envdVersion: "0.6.4",
      envdAccessToken: TOKEN,
      domain: null,
    }),
  );
  const sandbox = await Sandbox.connect(sandboxId, { apiKey: "k", apiUrl: api.url, sandboxUrl: proxyUrl });
  return { sandbox, exec: route.exec, sandboxId };
}

describe("through the real proxy with header routing", () => {
  test("Sandbox.connect with apiUrl + sandboxUrl reaches envd through the proxy: commands, files, pty", async () => {
    const { sandbox } = await routedSandbox(proxy.url);
    expect((await sandbox.commands.run("echo via-proxy")).stdout).toBe("via-proxy\n");
    const name = scratch("proxy");
    await sandbox.files.write(name, "through");
    expect(await sandbox.files.read(name)).toBe("through");
    expect(await sandbox.isRunning()).toBe(true);
    let text = "";
    const terminal = await sandbox.pty.create({
      cols: 80,
      rows: 24,
      onData: (d) => {
        text += new TextDecoder().decode(d);
      },
    });
    await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode("echo pty-$((3*3))\n"));
    await until(() => text.includes("pty-9"), "pty output through the proxy");
    await sandbox.pty.kill(terminal.pid);
  });

  test("sandbox.ports reaches a user port by header routing (no DNS), with the proxy's URL", async () => {
    const { sandbox, sandboxId } = await routedSandbox(proxy.url);
    expect(sandbox.ports.url(8080)).toBe(proxy.url);
    expect(sandbox.ports.headers(8080)).toEqual({ "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": "8080" });
    const res = await sandbox.ports.fetch(8080, "/hello");
    expect(await res.text()).toBe("web /hello 8080");
    expect(sandbox.getHost(8080)).toBe(`8080-${sandboxId}.e2b.app`);
  });

  test("a proxy restart mid-command is invisible: the stream resumes with replay, output complete and not doubled", async () => {
    const first = await startTestProxy({ PROXY_DRAIN_TIMEOUT_MS: "100" });
    const port = first.port;
    const { sandbox } = await routedSandbox(first.url);
    const marker = `/tmp/${scratch("restart")}`;
    const handle = await sandbox.commands.run(`seq 1 1000; read x; seq 1001 3000; touch ${marker}`, {
      background: true,
      stdin: true,
    });
    await until(() => handle.stdout.endsWith("1000\n"), "output before the restart");
    await first.close();
    // While the proxy is down the command goes on (input sent straight to envd).
    const direct = new Sandbox({
      sandboxId: "direct",
      envdVersion: "0.6.4",
      envdAccessToken: TOKEN,
      sandboxUrl: envd.url,
    });
    await direct.commands.sendStdin(handle.pid, "x\n");
    await until(() => direct.files.exists(marker), "output while the proxy was down");
    const second = await startTestProxy({ PROXY_PORT: String(port), PROXY_DRAIN_TIMEOUT_MS: "100" });
    try {
      const result = await handle.wait();
      let expected = "";
      for (let i = 1; i <= 3000; i++) expected += `${i}\n`;
      expect(result.stdout).toBe(expected);
      expect(handle.reconnects).toBeGreaterThanOrEqual(1);
    } finally {
      await second.close();
    }
  });

  test("a killed sandbox (route deleted) ends a waiting command with TimeoutError, not endless retries", async () => {
    const { sandbox, sandboxId, exec } = await routedSandbox(proxy.url);
    const handle = await sandbox.commands.run("sleep 600", { background: true });
    await routes.delete(sandboxId, exec);
    const error = await handle.wait().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TimeoutError);
    expect((error as Error).message).toContain("killed or reached its end of life");
    expect(await sandbox.isRunning()).toBe(false);
    await new Sandbox({
      sandboxId: "d",
      envdVersion: "0.6.4",
      envdAccessToken: TOKEN,
      sandboxUrl: envd.url,
    }).commands.kill(handle.pid);
  });
});
