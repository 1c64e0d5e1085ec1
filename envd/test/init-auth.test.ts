import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fileSignature } from "../src/auth.js";
import { loadConfig } from "../src/config.js";
import { ENVD_VERSION } from "../src/version.js";
import { connectUnary, sdkSandbox, startTestEnvd, type TestEnvd } from "./harness.js";

const UNAUTHORIZED = {
  code: 401,
  message: "unauthorized access, please provide a valid access token or method signing if supported",
};

describe("envd HTTP control routes and access token", () => {
  let envd: TestEnvd;
  beforeAll(async () => {
    envd = await startTestEnvd();
  });
  afterAll(async () => {
    await envd.stop();
  });

  it("GET /health answers 204 without a body and without auth", async () => {
    const res = await fetch(`${envd.url}/health`);
    expect(res.status).toBe(204);
    expect(await res.text()).toBe("");
  });

  it("an unsecured envd needs no token and the SDK sees it running", async () => {
    expect(await sdkSandbox(envd).isRunning()).toBe(true);
    const res = await fetch(`${envd.url}/envs`);
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ E2B_SANDBOX: "true" });
  });

  it("POST /init sets env vars, default user and token; then every route but health, init and files needs the token", async () => {
    const token = "init-token-0123456789abcdef";
    const init = await fetch(`${envd.url}/init`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ envVars: { FROM_INIT: "yes" }, accessToken: token, defaultUser: "user" }),
    });
    expect(init.status).toBe(204);
    expect(init.headers.get("x-envd-version")).toBe(ENVD_VERSION);

    const denied = await fetch(`${envd.url}/envs`);
    expect(denied.status).toBe(401);
    expect(await denied.json()).toEqual(UNAUTHORIZED);

    const wrong = await connectUnary(envd, "process.Process/List", {}, { "X-Access-Token": "nope" });
    expect(wrong.status).toBe(401);

    const envs = await fetch(`${envd.url}/envs`, { headers: { "X-Access-Token": token } });
    expect(await envs.json()).toMatchObject({ E2B_SANDBOX: "true", FROM_INIT: "yes" });

    expect((await fetch(`${envd.url}/health`)).status).toBe(204);

    // A second /init must present the current token; then it can clear it.
    const reinitDenied = await fetch(`${envd.url}/init`, { method: "POST", body: "{}" });
    expect(reinitDenied.status).toBe(401);
    const reinit = await fetch(`${envd.url}/init`, {
      method: "POST",
      headers: { "X-Access-Token": token },
      body: JSON.stringify({ accessToken: "", envVars: {} }),
    });
    expect(reinit.status).toBe(204);
    const open = await fetch(`${envd.url}/envs`);
    expect(await open.json()).not.toHaveProperty("FROM_INIT");
  });

  it("POST /init rejects malformed bodies and unknown users with 400 naming the problem", async () => {
    const badJson = await fetch(`${envd.url}/init`, { method: "POST", body: "{not json" });
    expect(badJson.status).toBe(400);
    expect(((await badJson.json()) as { message: string }).message).toMatch(/not valid JSON/);

    const badVars = await fetch(`${envd.url}/init`, { method: "POST", body: JSON.stringify({ envVars: { A: 1 } }) });
    expect(badVars.status).toBe(400);
    expect(((await badVars.json()) as { message: string }).message).toContain("envVars.A");

    const badUser = await fetch(`${envd.url}/init`, {
      method: "POST",
      body: JSON.stringify({ defaultUser: "no-such-user-xyz" }),
    });
    expect(badUser.status).toBe(401);
    expect(((await badUser.json()) as { message: string }).message).toContain("no-such-user-xyz");
  });

  it("GET /metrics reports E2B's snake_case fields", async () => {
    const res = await fetch(`${envd.url}/metrics`);
    expect(res.status).toBe(200);
    const metrics = (await res.json()) as Record<string, number>;
    for (const field of ["ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "disk_used", "disk_total"]) {
      expect(typeof metrics[field]).toBe("number");
    }
    expect(metrics.mem_total).toBeGreaterThan(0);
    expect(metrics.disk_total).toBeGreaterThan(0);
  });

  it("unknown paths answer 404 JSON and CORS preflights succeed", async () => {
    const res = await fetch(`${envd.url}/no/such/route`, { method: "POST" });
    expect(res.status).toBe(404);
    const preflight = await fetch(`${envd.url}/process.Process/Start`, {
      method: "OPTIONS",
      headers: { Origin: "http://example.test", "Access-Control-Request-Method": "POST" },
    });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-origin")).toBe("*");
  });

  it("sends CORS headers to a browser's request (one with an Origin) and to no other", async () => {
    const fromBrowser = await fetch(`${envd.url}/health`, { headers: { Origin: "http://example.test" } });
    expect(fromBrowser.status).toBe(204);
    expect(fromBrowser.headers.get("access-control-allow-origin")).toBe("*");
    expect(fromBrowser.headers.get("access-control-expose-headers")).toContain("Connect-Protocol-Version");
    const fromProgram = await fetch(`${envd.url}/health`);
    expect(fromProgram.status).toBe(204);
    expect([...fromProgram.headers.keys()].filter((name) => name.startsWith("access-control-"))).toEqual([]);
  });

  it("never writes the access token to its log", async () => {
    const token = "secret-token-must-not-be-logged-42";
    await fetch(`${envd.url}/init`, { method: "POST", body: JSON.stringify({ accessToken: token }) });
    await fetch(`${envd.url}/envs`, { headers: { "X-Access-Token": token } });
    await fetch(`${envd.url}/init`, {
      method: "POST",
      headers: { "X-Access-Token": token },
      body: JSON.stringify({ accessToken: "" }),
    });
    expect(envd.logs()).toContain("sandbox initialised");
    expect(envd.logs()).not.toContain(token);
  });
});

describe("file URL signatures", () => {
  it("match E2B's test vector", () => {
    expect(fileSignature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0")).toBe(
      "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E",
    );
  });

  it("bind the expiration into the signature", () => {
    const plain = fileSignature("a.txt", "write", "", "tok");
    const expiring = fileSignature("a.txt", "write", "", "tok", 1_700_000_000);
    expect(expiring).not.toBe(plain);
    expect(expiring).toMatch(/^v1_[A-Za-z0-9+/]+$/);
  });
});

describe("start-up warm-up", () => {
  it("runs one login shell through Start right after listening, then leaves no process behind", async () => {
    const envd = await startTestEnvd({ warmup: true });
    try {
      const deadline = Date.now() + 10_000;
      while (!envd.logs().includes("warm-up done") && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect(envd.logs()).toMatch(/"msg":"warm-up done".*"status":200/);
      const list = await connectUnary(envd, "process.Process/List", {});
      expect(list.body).toEqual({});
    } finally {
      await envd.stop();
    }
  });

  it("with --warm-up after-init waits for the first /init, then warms up with the token it set", async () => {
    const envd = await startTestEnvd({ warmup: "after-init" });
    const waitForLog = async (text: string) => {
      const deadline = Date.now() + 10_000;
      while (!envd.logs().includes(text) && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };
    try {
      // A cold start's /health and /init come first: nothing else runs before them.
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect((await fetch(`${envd.url}/health`)).status).toBe(204);
      expect(envd.logs()).not.toContain("warm-up");
      expect(envd.logs()).not.toContain("process started");
      const init = await fetch(`${envd.url}/init`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ accessToken: "after-init-token" }),
      });
      expect(init.status).toBe(204);
      await waitForLog("warm-up done");
      // 200: the warm-up's Start carried the token /init had just set (a 401 would say it did not).
      expect(envd.logs()).toMatch(/"msg":"warm-up done".*"status":200/);
      expect(envd.logs().match(/"msg":"warm-up done"/g)).toHaveLength(1);
      // A second /init (a claim's, a resume's) does not warm up again.
      const again = await fetch(`${envd.url}/init`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Access-Token": "after-init-token" },
        body: JSON.stringify({ accessToken: "after-init-token" }),
      });
      expect(again.status).toBe(204);
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(envd.logs().match(/"msg":"warm-up (done|failed)"/g)).toHaveLength(1);
    } finally {
      await envd.stop();
    }
  });

  it("refuses a --warm-up it does not know, naming the flag", () => {
    expect(() => loadConfig(["--warm-up", "later"], {})).toThrow(/--warm-up must be now, after-init or off/);
    expect(loadConfig([], { ENVD_WARMUP: "0" }).warmup).toBe("off");
    expect(loadConfig([], {}).warmup).toBe("now");
  });
});
