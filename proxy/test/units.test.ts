import { createHash } from "node:crypto";
import type { SandboxRoute } from "@warren/proto/redis";
import { describe, expect, it } from "vitest";
import { tokenMatches, upstreamAddress } from "../src/admission.js";
import { EventCache } from "../src/cache.js";
import { ConfigError, loadConfig } from "../src/config.js";
import { goJson, wantsHtml } from "../src/errors.js";
import { SandboxConnections } from "../src/limits.js";
import { cleanPath, controlOnlyPath, Router, requestHostname } from "../src/routing.js";

const ID = "i0123456789abcdefghij";

describe("Router: E2B's GetTargetFromRequest", () => {
  const any = new Router({ domains: [], sharedHosts: [] });
  const scoped = new Router({ domains: ["warren.test", "other.test"], sharedHosts: ["edge.internal"] });

  it.each([
    [`49983-${ID}.e2b.app`, { sandboxId: ID, port: 49983, via: "host" }],
    [`3000-${ID}.warren.test:8443`, { sandboxId: ID, port: 3000, via: "host" }],
    [`3000-${ID}-legacyclient.warren.test`, { sandboxId: ID, port: 3000, via: "host" }],
    [`3000-${ID.toUpperCase()}.Warren.Test`, { sandboxId: ID, port: 3000, via: "host" }],
    [`3000-${ID}.warren.test.`, { sandboxId: ID, port: 3000, via: "host" }],
  ])("routes Host %s by <port>-<id>.<domain>", (host, expected) => {
    expect(any.resolve(host, undefined, undefined)).toEqual(expected);
  });

  it.each([
    ["localhost", "missing header"],
    ["localhost:3000", "Invalid host"],
    ["warren.test", "Invalid host"],
    [`${ID}.warren.test`, "Invalid host"],
    ["sandbox.warren.test", "Invalid host"],
    ["", "Invalid host"],
    [`x3000-${ID}.warren.test`, "Invalid sandbox port"],
    [`0-${ID}.warren.test`, "Invalid sandbox port"],
    [`65536-${ID}.warren.test`, "Invalid sandbox port"],
    [`-${ID}.warren.test`, "Invalid sandbox port"],
    ["3000-.warren.test", "Invalid sandbox ID"],
    ["3000-abc_def.warren.test", "Invalid sandbox ID"],
  ])("answers Host %s with 400 %s", (host, failure) => {
    const idHeader = host === "localhost" ? ID : undefined;
    expect(any.resolve(host, idHeader, undefined)).toBe(failure);
  });

  it("accepts only configured domains when some are configured", () => {
    expect(scoped.resolve(`3000-${ID}.other.test`, undefined, undefined)).toMatchObject({ sandboxId: ID });
    expect(scoped.resolve(`3000-${ID}.evil.test`, undefined, undefined)).toBe("Invalid host");
    expect(scoped.resolve(`3000-${ID}.sub.warren.test`, undefined, undefined)).toBe("Invalid host");
  });

  it.each([
    "localhost",
    "localhost:3002",
    "127.0.0.1:3002",
    "10.1.2.3",
    "[::1]:3002",
    "sandbox.warren.test",
    "sandbox.anything.example",
    "edge.internal:80",
  ])("routes by E2b-Sandbox-Id/-Port on shared host %s", (host) => {
    expect(scoped.resolve(host, ID, "49983")).toEqual({ sandboxId: ID, port: 49983, via: "headers" });
  });

  it("answers E2B's 400s for bad routing headers on a shared host", () => {
    expect(any.resolve("localhost", ID, undefined)).toBe("missing header");
    expect(any.resolve("localhost", undefined, "49983")).toBe("missing header");
    expect(any.resolve("localhost", ID, "abc")).toBe("Invalid sandbox port");
    expect(any.resolve("localhost", ID, "-1")).toBe("Invalid sandbox port");
    expect(any.resolve("localhost", "BAD-ID", "49983")).toBe("Invalid sandbox ID");
    expect(any.resolve("localhost", "a".repeat(64), "49983")).toBe("Invalid sandbox ID");
  });

  it("ignores routing headers on a sandbox host and routes by the Host instead", () => {
    expect(any.resolve(`3000-${ID}.warren.test`, "iother", "80")).toEqual({ sandboxId: ID, port: 3000, via: "host" });
    // `sandbox.` alone has no domain after it: not a shared host.
    expect(any.resolve("sandbox.", ID, "80")).toBe("Invalid host");
  });

  it("reduces Host values to a bare lowercase host name", () => {
    expect(requestHostname("Sandbox.Warren.Test:443")).toBe("sandbox.warren.test");
    expect(requestHostname("[::1]:80")).toBe("::1");
    expect(requestHostname("::1")).toBe("::1");
    expect(requestHostname("host.")).toBe("host");
  });
});

describe("control-only envd paths", () => {
  it.each([
    "/init",
    "/init/",
    "//init",
    "/files/../init",
    "/%69nit",
    "/init?x=1",
    "/./freeze",
    "/unfreeze",
    "/collapse",
    "/fsfreeze",
    "/fsthaw",
    "/upgrade",
    "http://host/init",
  ])("refuses %s", (url) => {
    expect(controlOnlyPath(url)).toBeDefined();
  });

  it.each([
    "/",
    "/health",
    "/files",
    "/initx",
    "/files/init",
    "/process.Process/Start",
    "/envs",
    "/%zz",
  ])("lets %s through", (url) => {
    expect(controlOnlyPath(url)).toBeUndefined();
  });

  it("reports the decoded path, not the cleaned one (E2B's body field)", () => {
    expect(controlOnlyPath("/files/../%69nit")).toBe("/files/../init");
    expect(cleanPath("/a/./b/../../init/")).toBe("/init");
  });
});

describe("error bodies and content negotiation", () => {
  const chrome =
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/58.0.3029.110 Safari/537.3";

  it.each([
    [{}, false],
    [{ "user-agent": "node" }, false],
    [{ "user-agent": "e2b-js-sdk/2.51.0" }, false],
    [{ "user-agent": chrome }, true],
    [{ "user-agent": chrome, "sec-fetch-mode": "navigate", accept: "text/html" }, true],
    [{ "user-agent": chrome, accept: "application/json" }, false],
    [{ "user-agent": chrome, "sec-fetch-mode": "cors", accept: "*/*" }, false],
    [{ "user-agent": chrome, "sec-fetch-mode": "websocket" }, false],
    [{ "user-agent": chrome, "x-requested-with": "XMLHttpRequest" }, false],
    [{ "user-agent": chrome, "sec-fetch-mode": "navigate", "x-requested-with": "XMLHttpRequest" }, true],
    [{ "user-agent": "curl/8", accept: "text/html" }, true],
  ])("headers %j get HTML: %s", (headers, html) => {
    expect(wantsHtml(headers)).toBe(html);
  });

  it("escapes JSON like Go's encoding/json", () => {
    expect(goJson({ path: "/<a>&b" })).toBe('{"path":"/\\u003ca\\u003e\\u0026b"}');
  });
});

describe("traffic token and upstream address", () => {
  const hash = createHash("sha256").update("secret-token").digest("hex");

  it("accepts the token whose SHA-256 is the route's hash, and nothing else", () => {
    expect(tokenMatches("secret-token", hash)).toBe(true);
    expect(tokenMatches("secret-token", hash.toUpperCase())).toBe(true);
    expect(tokenMatches("secret-tokem", hash)).toBe(false);
    expect(tokenMatches("secret-token", "")).toBe(false);
    expect(tokenMatches("secret-token", "zz")).toBe(false);
  });

  const route = { sandboxAddr: "10.0.0.7", ports: { "3000": "127.0.0.1:41000", "8080": "[::1]:41001" } } as const;
  it("uses route.ports[P] when mapped, else sandboxAddr:P", () => {
    expect(upstreamAddress(route as unknown as SandboxRoute, 3000)).toEqual({ host: "127.0.0.1", port: 41000 });
    expect(upstreamAddress(route as unknown as SandboxRoute, 8080)).toEqual({ host: "::1", port: 41001 });
    expect(upstreamAddress(route as unknown as SandboxRoute, 49983)).toEqual({ host: "10.0.0.7", port: 49983 });
  });
});

describe("route cache", () => {
  const route = (exec: string) => ({ sandboxId: ID, exec }) as SandboxRoute;

  it("does not cache a read that was in flight when the sandbox's route event arrived", async () => {
    const reads: Array<(r: SandboxRoute) => void> = [];
    const cache = new EventCache<SandboxRoute>(60_000, 10, () => new Promise((resolve) => reads.push(resolve)));
    cache.setEnabled(true);
    const stale = cache.load(ID);
    cache.invalidate(ID); // the event for the new incarnation arrives mid-read
    const fresh = cache.load(ID); // a request after the event must not join the old read
    expect(reads).toHaveLength(2);
    reads[0]!(route("old"));
    reads[1]!(route("new"));
    expect((await stale)?.exec).toBe("old");
    expect((await fresh)?.exec).toBe("new");
    expect(cache.peek(ID)?.value?.exec).toBe("new");
  });

  it("shares one read among concurrent misses and expires entries after the TTL", async () => {
    let now = 0;
    let reads = 0;
    const cache = new EventCache<SandboxRoute>(
      1000,
      10,
      async () => {
        reads += 1;
        return route(`e${reads}`);
      },
      () => now,
    );
    cache.setEnabled(true);
    await Promise.all([cache.load(ID), cache.load(ID), cache.load(ID)]);
    expect(reads).toBe(1);
    expect(cache.peek(ID)?.value?.exec).toBe("e1");
    now = 1000;
    expect(cache.peek(ID)).toBeUndefined();
  });

  it("serves nothing while disabled (no live event subscription) and evicts the oldest when full", async () => {
    const cache = new EventCache<SandboxRoute>(60_000, 2, async (id) => ({ sandboxId: id, exec: "x" }) as SandboxRoute);
    await cache.load("a");
    expect(cache.peek("a")).toBeUndefined();
    cache.setEnabled(true);
    await cache.load("a");
    await cache.load("b");
    await cache.load("c");
    expect(cache.peek("a")).toBeUndefined();
    expect(cache.peek("c")?.value?.sandboxId).toBe("c");
  });
});

describe("per-sandbox connections", () => {
  it("refuses past the limit and cuts only the selected incarnations", () => {
    const cuts: string[] = [];
    const connections = new SandboxConnections(2);
    const a = connections.open(ID, "old", () => cuts.push("a"));
    connections.open(ID, "new", () => cuts.push("b"));
    expect(connections.open(ID, "new", () => {})).toBeUndefined();
    expect(connections.open("iother", "x", () => {})).toBeDefined();
    expect(connections.cut(ID, (exec) => exec !== "new")).toBe(1);
    expect(cuts).toEqual(["a"]);
    connections.close(a!);
    expect(connections.openFor(ID)).toBe(1);
  });
});

describe("config", () => {
  it("has documented defaults", () => {
    const config = loadConfig({});
    expect(config).toMatchObject({
      host: "0.0.0.0",
      port: 3002,
      domains: [],
      redisUrl: "redis://127.0.0.1:6379",
      routeCacheTtlMs: 5000,
      envdPort: 49983,
      maxConnectionsPerSandbox: 1000,
      metricsPort: 9464,
      tls: undefined,
      workers: 1,
    });
  });

  it("parses lists and rejects bad values with the variable's name", () => {
    expect(loadConfig({ PROXY_DOMAINS: "A.test, b.test", PROXY_WORKERS: "auto" }, 4)).toMatchObject({
      domains: ["a.test", "b.test"],
      workers: 4,
    });
    expect(() => loadConfig({ PROXY_PORT: "http" })).toThrow(/PROXY_PORT/);
    expect(() => loadConfig({ PROXY_TLS_CERT_FILE: "/x" })).toThrow(ConfigError);
    expect(() => loadConfig({ PROXY_DOMAINS: "bad domain" })).toThrow(/PROXY_DOMAINS/);
  });
});
