import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import express from "express";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { consoleRoutes, loadConsoleConfig, parseSandboxUrlTemplate } from "../src/api/console.js";

const built = mkdtempSync(join(tmpdir(), "warren-console-"));
const missing = join(built, "not-built");
mkdirSync(join(built, "assets"));
writeFileSync(join(built, "index.html"), "<!doctype html><title>console</title>");
writeFileSync(join(built, "assets", "main-ABC123.js"), "console.log(1)");
writeFileSync(join(built, "secret.txt"), "outside assets");

const servers: import("node:http").Server[] = [];
async function serve(env: NodeJS.ProcessEnv): Promise<string> {
  const app = express();
  app.use(consoleRoutes(loadConsoleConfig(env)));
  app.use((_req, res) => {
    res.status(404).send("fallthrough");
  });
  const server = app.listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  servers.push(server);
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** A GET sent as is: fetch normalizes dot segments and will not set Host. */
function rawGet(
  base: string,
  path: string,
  host?: string,
): Promise<{ status: number; headers: import("node:http").IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, { headers: host ? { Host: host } : {} }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk) => {
        body += chunk;
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

let url = "";
let withSandboxUrl = "";
let notBuilt = "";
beforeAll(async () => {
  url = await serve({ WARREN_CONSOLE_DIR: built });
  withSandboxUrl = await serve({
    WARREN_CONSOLE_DIR: built,
    WARREN_CONSOLE_SANDBOX_URL: "http://{port}-{sandboxID}.localhost:8080",
  });
  notBuilt = await serve({ WARREN_CONSOLE_DIR: missing });
});
afterAll(() => {
  for (const server of servers) server.close();
  rmSync(built, { recursive: true, force: true });
});

describe("the api's /console route", () => {
  it("serves index.html revalidated every time, with a CSP that names no remote origin", async () => {
    const res = await fetch(`${url}/console`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(res.headers.get("cache-control")).toBe("no-cache");
    expect(res.headers.get("x-content-type-options")).toBe("nosniff");
    const csp = res.headers.get("content-security-policy") ?? "";
    expect(csp).toContain("default-src 'none'");
    expect(csp).toContain("script-src 'self';");
    expect(csp).toContain("connect-src 'self';");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toMatch(/https?:\/\//);
    expect(await res.text()).toContain("<title>console</title>");
  });

  it("answers index.html for any path under /console (the console routes in the browser)", async () => {
    for (const path of ["/console/", "/console/sandboxes", "/console/sandboxes/abc/terminal"]) {
      const res = await fetch(`${url}${path}`);
      expect(res.status, path).toBe(200);
      expect(await res.text()).toContain("<title>console</title>");
    }
  });

  it("serves content-hashed assets cached for a year, and 404s unknown or escaping asset paths", async () => {
    const res = await fetch(`${url}/console/assets/main-ABC123.js`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect(res.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
    expect(await res.text()).toBe("console.log(1)");
    expect((await fetch(`${url}/console/assets/nope-1.js`)).status).toBe(404);
    expect((await fetch(`${url}/console/assets/..%2fsecret.txt`)).status).toBe(404);
    const escaping = await rawGet(url, "/console/assets/../secret.txt");
    expect(escaping.body).not.toContain("outside assets");
    expect((await rawGet(url, "/console/assets/%2e%2e/secret.txt")).body).not.toContain("outside assets");
  });

  it("allows connections to the sandbox hosts of WARREN_CONSOLE_SANDBOX_URL and hands the template to the page", async () => {
    const res = await fetch(`${withSandboxUrl}/console`);
    expect(res.headers.get("content-security-policy")).toContain("connect-src 'self' http://*.localhost:8080;");
    const settings = await fetch(`${withSandboxUrl}/console/settings.json`);
    expect(settings.headers.get("cache-control")).toBe("no-store");
    expect(await settings.json()).toEqual({ sandboxUrl: "http://{port}-{sandboxID}.localhost:8080" });
  });

  it("derives the sandbox hosts from an api.<domain> Host (the console behind the proxy)", async () => {
    const settings = await rawGet(url, "/console/settings.json", "api.warren.test:8443");
    expect(JSON.parse(settings.body)).toEqual({ sandboxUrl: "https://{port}-{sandboxID}.warren.test:8443" });
    const page = await rawGet(url, "/console", "api.warren.test");
    expect(page.headers["content-security-policy"]).toContain("connect-src 'self' https://*.warren.test;");
    const plain = await fetch(`${url}/console/settings.json`);
    expect(await plain.json()).toEqual({ sandboxUrl: null });
  });

  it("answers 503 with what to do when the bundle is not built", async () => {
    const res = await fetch(`${notBuilt}/console/sandboxes`);
    expect(res.status).toBe(503);
    expect(await res.text()).toMatch(/web console is not built: run `npm run build`/);
  });

  it("leaves other paths to the rest of the api", async () => {
    const res = await fetch(`${url}/consoles`);
    expect(await res.text()).toBe("fallthrough");
  });

  it("refuses sandbox URL templates a browser could not use, naming the value", () => {
    expect(() => parseSandboxUrlTemplate("http://127.0.0.1:3001")).toThrow(
      /'http:\/\/127.0.0.1:3001' must have \{port\}/,
    );
    expect(() => parseSandboxUrlTemplate("ftp://{port}-{sandboxID}.x")).toThrow(/must be http or https/);
    expect(() => parseSandboxUrlTemplate("https://{port}-{sandboxID}.x/path")).toThrow(/origin only/);
    expect(parseSandboxUrlTemplate("https://{port}-{sandboxID}.sb.example.com/").cspSource).toBe(
      "https://*.sb.example.com",
    );
  });
});
