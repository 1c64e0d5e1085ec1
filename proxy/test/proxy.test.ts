import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { request as httpsRequest } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  closedPort,
  RouteWriter,
  randomSandboxId,
  send,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
  waitUntil,
} from "./harness.js";

const TOKEN = "traffic-token-7f1c2e";
const TOKEN_HASH = createHash("sha256").update(TOKEN).digest("hex");
const CHROME = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36";

let proxy: TestProxy;
let routes: RouteWriter;
let upstream: Upstream;
/** What the "sandbox" saw of the last request. */
let seen: {
  host?: string | undefined;
  forwardedHost?: string | undefined;
  url?: string | undefined;
  token?: string | undefined;
} = {};

beforeAll(async () => {
  routes = new RouteWriter();
  upstream = await startUpstream((req, res) => {
    seen = {
      host: req.headers.host,
      forwardedHost: req.headers["x-forwarded-host"] as string | undefined,
      url: req.url,
      token: req.headers["e2b-traffic-access-token"] as string | undefined,
    };
    if (req.url === "/hold") return; // never answers: holds a connection slot
    res.writeHead(200, { "Content-Type": "text/plain", "X-Sandbox": "yes" });
    res.end(`hello from ${req.url}`);
  });
  proxy = await startTestProxy({ PROXY_DOMAINS: "warren.test", PROXY_MAX_CONNECTIONS_PER_SANDBOX: "2" });
});

afterAll(async () => {
  await upstream.close(); // first: it resets the held /hold exchanges, so the proxy drains at once
  await proxy.close();
  await routes.cleanup();
});

async function runningSandbox(
  overrides: Parameters<RouteWriter["write"]>[0] extends infer T ? Partial<T> : never = {},
) {
  const sandboxId = randomSandboxId();
  const route = await routes.write({
    sandboxId,
    sandboxAddr: "127.0.0.1",
    ports: { "49983": `127.0.0.1:${upstream.port}`, "3000": `127.0.0.1:${upstream.port}` },
    ...overrides,
  });
  return { sandboxId, route };
}

describe("routing into a running sandbox", () => {
  it("forwards by Host <port>-<id>.<domain>, preserving Host, path and query", async () => {
    const { sandboxId } = await runningSandbox();
    const host = `3000-${sandboxId}.warren.test`;
    const reply = await send(proxy.port, { host, path: "/a/b?c=d" });
    expect(reply.status).toBe(200);
    expect(reply.body).toBe("hello from /a/b?c=d");
    expect(reply.headers["x-sandbox"]).toBe("yes");
    expect(seen.host).toBe(host);
  });

  it("forwards by E2b-Sandbox-Id/-Port on a shared host (IP literal, localhost, sandbox.<domain>)", async () => {
    const { sandboxId } = await runningSandbox();
    for (const host of [`127.0.0.1:${proxy.port}`, "localhost", "sandbox.warren.test"]) {
      const reply = await send(proxy.port, {
        host,
        path: "/health",
        headers: { "E2b-Sandbox-Id": sandboxId, "E2b-Sandbox-Port": "49983" },
      });
      expect(reply.status, host).toBe(200);
      expect(seen.host).toBe(host);
    }
  });

  it("reaches sandboxAddr:P when the port is not in route.ports", async () => {
    const { sandboxId } = await runningSandbox({ ports: {} });
    const reply = await send(proxy.port, { host: `${upstream.port}-${sandboxId}.warren.test` });
    expect(reply.status).toBe(200);
  });

  it("masks the Host for non-envd ports when the route asks for it, keeping the original in X-Forwarded-Host", async () => {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: E2B's literal placeholder
    const { sandboxId } = await runningSandbox({ maskRequestHost: "localhost:${PORT}" });
    const host = `3000-${sandboxId}.warren.test`;
    await send(proxy.port, { host });
    expect(seen).toMatchObject({ host: "localhost:3000", forwardedHost: host });
    await send(proxy.port, { host: `49983-${sandboxId}.warren.test` });
    expect(seen).toMatchObject({ host: `49983-${sandboxId}.warren.test`, forwardedHost: undefined });
  });
});

describe("E2B's error answers, byte for byte", () => {
  it.each([
    ["no Host routing information", { host: "warren.test" }, "Invalid host\n"],
    ["a Host outside the configured domains", { host: "3000-iabc.evil.test" }, "Invalid host\n"],
    ["a non-numeric port label", { host: "x-iabc.warren.test" }, "Invalid sandbox port\n"],
    [
      "a sandbox id with capitals in the header",
      { host: "localhost", headers: { "E2b-Sandbox-Id": "ABC", "E2b-Sandbox-Port": "1" } },
      "Invalid sandbox ID\n",
    ],
    ["only one routing header", { host: "localhost", headers: { "E2b-Sandbox-Id": "iabc" } }, "missing header\n"],
    [
      "a non-integer port header",
      { host: "localhost", headers: { "E2b-Sandbox-Id": "iabc", "E2b-Sandbox-Port": "4x" } },
      "Invalid sandbox port\n",
    ],
  ])("400 plain text for %s", async (_name, options, body) => {
    const reply = await send(proxy.port, options);
    expect(reply.status).toBe(400);
    expect(reply.headers["content-type"]).toBe("text/plain; charset=utf-8");
    expect(reply.headers["x-content-type-options"]).toBe("nosniff");
    expect(reply.body).toBe(body);
  });

  it("502 'The sandbox was not found' with the sandbox id for an unknown sandbox", async () => {
    const sandboxId = randomSandboxId();
    const reply = await send(proxy.port, { host: `49983-${sandboxId}.warren.test`, path: "/health" });
    expect(reply.status).toBe(502);
    expect(reply.headers["content-type"]).toBe("application/json; charset=utf-8");
    expect(reply.headers["access-control-allow-origin"]).toBe("*");
    expect(reply.body).toBe(`{"sandboxId":"${sandboxId}","message":"The sandbox was not found","code":502}`);
  });

  it("502 'port is not open' when nothing listens on the sandbox port", async () => {
    const port = await closedPort();
    const { sandboxId } = await runningSandbox({ ports: { "8080": `127.0.0.1:${port}` } });
    const reply = await send(proxy.port, { host: `8080-${sandboxId}.warren.test` });
    expect(reply.status).toBe(502);
    expect(reply.body).toBe(
      `{"sandboxId":"${sandboxId}","message":"The sandbox is running but port is not open","port":8080,"code":502}`,
    );
  });

  it("a request with a body gets the same 502 from a closed port, and a chunked body reaches an open one whole", async () => {
    const port = await closedPort();
    const { sandboxId } = await runningSandbox({ ports: { "8080": `127.0.0.1:${port}` } });
    const body = "x".repeat(100_000);
    const refused = await send(proxy.port, { host: `8080-${sandboxId}.warren.test`, method: "POST", body });
    expect(refused.status).toBe(502);
    expect(JSON.parse(refused.body)).toMatchObject({
      message: "The sandbox is running but port is not open",
      port: 8080,
    });
    const late = await startUpstream((req, res) => {
      let length = 0;
      req.on("data", (chunk: Buffer) => {
        length += chunk.length;
      });
      req.on("end", () => res.end(`got ${length}`));
    });
    try {
      const open = await runningSandbox({ ports: { "8080": `127.0.0.1:${late.port}` } });
      const reply = await send(proxy.port, {
        host: `8080-${open.sandboxId}.warren.test`,
        method: "POST",
        headers: { "Transfer-Encoding": "chunked" },
        body,
      });
      expect(reply.status).toBe(200);
      expect(reply.body).toBe(`got ${body.length}`);
    } finally {
      await late.close();
    }
  });

  it("404 for control-only envd paths such as /init, before any route lookup", async () => {
    const sandboxId = randomSandboxId(); // no route: the refusal must not depend on the sandbox
    for (const path of ["/init", "/init/", "/files/../init", "/%69nit"]) {
      const reply = await send(proxy.port, { host: `49983-${sandboxId}.warren.test`, path, method: "POST" });
      expect(reply.status, path).toBe(404);
      expect(reply.body).toBe(
        `{"message":"This endpoint is reserved for the E2B control plane and is not reachable through the sandbox URL","path":"${decodeURIComponent(path)}","code":404}`,
      );
    }
    // The same path on a user port is the user's own route.
    const { sandboxId: running } = await runningSandbox();
    expect((await send(proxy.port, { host: `3000-${running}.warren.test`, path: "/init" })).status).toBe(200);
  });

  it("a small HTML page instead of JSON for a browser navigation", async () => {
    const sandboxId = randomSandboxId();
    const reply = await send(proxy.port, {
      host: `3000-${sandboxId}.warren.test`,
      headers: { "User-Agent": CHROME, Accept: "text/html", "Sec-Fetch-Mode": "navigate" },
    });
    expect(reply.status).toBe(502);
    expect(reply.headers["content-type"]).toBe("text/html; charset=utf-8");
    expect(reply.body).toMatch(/^<!DOCTYPE html>/);
    expect(reply.body).toContain("Sandbox not found");
    expect(reply.body).toContain(sandboxId);
  });

  it("429 with the limit once a sandbox has its maximum of concurrent connections", async () => {
    const { sandboxId } = await runningSandbox();
    const host = `3000-${sandboxId}.warren.test`;
    const held = [send(proxy.port, { host, path: "/hold" }), send(proxy.port, { host, path: "/hold" })];
    held.forEach((p) => void p.catch(() => {}));
    await waitUntil(() => proxy.running.proxy.openConnections >= 2, "two held connections");
    const reply = await send(proxy.port, { host });
    expect(reply.status).toBe(429);
    expect(reply.body).toBe(
      `{"sandboxId":"${sandboxId}","message":"The sandbox has too many concurrent incoming connections (limit: 2)","code":429,"connectionLimit":2}`,
    );
    // Another sandbox is not affected.
    const other = await runningSandbox();
    expect((await send(proxy.port, { host: `3000-${other.sandboxId}.warren.test` })).status).toBe(200);
  });
});

describe("traffic access token", () => {
  it("403 without the token on a private sandbox's user port, and the byte-exact messages", async () => {
    const { sandboxId } = await runningSandbox({ public: false, trafficTokenHash: TOKEN_HASH });
    const host = `3000-${sandboxId}.warren.test`;
    const missing = await send(proxy.port, { host });
    expect(missing.status).toBe(403);
    expect(missing.body).toBe(
      `{"sandboxId":"${sandboxId}","message":"Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing","code":403}`,
    );
    const wrong = await send(proxy.port, { host, headers: { "e2b-traffic-access-token": "nope" } });
    expect(wrong.status).toBe(403);
    expect(wrong.body).toBe(
      `{"sandboxId":"${sandboxId}","message":"Sandbox is secured with traffic access token. Provided token in header 'e2b-traffic-access-token' is invalid","code":403}`,
    );
  });

  it("forwards with the right token, and never asks for it on the envd port", async () => {
    const { sandboxId } = await runningSandbox({ public: false, trafficTokenHash: TOKEN_HASH });
    const ok = await send(proxy.port, {
      host: `3000-${sandboxId}.warren.test`,
      headers: { "E2B-Traffic-Access-Token": TOKEN },
    });
    expect(ok.status).toBe(200);
    const envd = await send(proxy.port, { host: `49983-${sandboxId}.warren.test`, path: "/health" });
    expect(envd.status).toBe(200);
  });

  it("is not required on public sandboxes; a private sandbox without a stored hash refuses every token", async () => {
    const open = await runningSandbox({ public: true, trafficTokenHash: TOKEN_HASH });
    expect((await send(proxy.port, { host: `3000-${open.sandboxId}.warren.test` })).status).toBe(200);
    const misconfigured = await runningSandbox({ public: false, trafficTokenHash: "" });
    const reply = await send(proxy.port, {
      host: `3000-${misconfigured.sandboxId}.warren.test`,
      headers: { "e2b-traffic-access-token": TOKEN },
    });
    expect(reply.status).toBe(403);
  });

  it("never writes a token into the logs", async () => {
    expect(proxy.logs()).not.toContain(TOKEN);
    expect(proxy.logs()).not.toContain(TOKEN_HASH);
  });
});

describe("TLS termination with a wildcard certificate", () => {
  let dir: string;
  let tlsProxy: TestProxy;
  let api: Upstream;
  /** The scheme the api was told its client used (X-Forwarded-Proto). */
  let apiSawProto: string | undefined;
  beforeAll(async () => {
    api = await startUpstream((req, res) => {
      apiSawProto = req.headers["x-forwarded-proto"] as string | undefined;
      res.writeHead(200).end("api");
    });
    dir = mkdtempSync(join(tmpdir(), "warren-proxy-tls-"));
    execFileSync(
      "openssl",
      [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-keyout",
        join(dir, "key.pem"),
        "-out",
        join(dir, "cert.pem"),
        "-subj",
        "/CN=*.warren.test",
        "-addext",
        "subjectAltName=DNS:*.warren.test",
      ],
      { stdio: "ignore" },
    );
    tlsProxy = await startTestProxy({
      PROXY_DOMAINS: "warren.test",
      PROXY_TLS_CERT_FILE: join(dir, "cert.pem"),
      PROXY_TLS_KEY_FILE: join(dir, "key.pem"),
      PROXY_API_URL: `http://127.0.0.1:${api.port}`,
    });
  });
  afterAll(async () => {
    await tlsProxy.close();
    await api.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const httpsGet = (host: string, path: string, headers: Record<string, string> = {}) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = httpsRequest(
        {
          host: "127.0.0.1",
          port: tlsProxy.port,
          servername: host,
          headers: { Host: host, ...headers },
          ca: readFileSync(join(dir, "cert.pem")),
          path,
        },
        (res) => {
          let body = "";
          res.on("data", (chunk) => {
            body += chunk;
          });
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on("error", reject);
      req.end();
    });

  it("serves https://<port>-<id>.<domain> with the wildcard cert and forwards to the sandbox", async () => {
    const { sandboxId } = await runningSandbox();
    const reply = await httpsGet(`3000-${sandboxId}.warren.test`, "/tls");
    expect(reply).toEqual({ status: 200, body: "hello from /tls" });
  });

  it("tells the api behind https://api.<domain> that its client came over https, whatever the client claims", async () => {
    // The api's links back to itself (a COPY step's upload URL) are built from Host and this scheme.
    expect(await httpsGet("api.warren.test", "/templates/t/files/h")).toEqual({ status: 200, body: "api" });
    expect(apiSawProto).toBe("https");
    await httpsGet("api.warren.test", "/health", { "X-Forwarded-Proto": "http" });
    expect(apiSawProto).toBe("https");
  });
});
