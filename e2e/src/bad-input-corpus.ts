/**
 * A corpus of bad requests (issue 18) against a running cluster's api, proxy, envd and code gateway: each case
 * names what it sends and which statuses are right for it (E2B's, where E2B has one). Used by
 * `e2e/test/bad-input.test.ts` (asserts) and `e2e/bench/bad-input.mjs` (prints the counts).
 */

export interface CorpusTarget {
  readonly apiUrl: string;
  readonly proxyUrl: string;
  readonly apiKey: string;
  readonly adminToken: string;
  /** A running code-interpreter sandbox and its tokens (envd and the code gateway are reached through the proxy). */
  readonly sandboxId: string;
  readonly envdAccessToken: string;
  readonly trafficAccessToken: string;
}

export interface CorpusCase {
  readonly component: "api" | "proxy" | "envd" | "code-gateway";
  readonly name: string;
  readonly method: string;
  readonly url: string;
  readonly headers?: Record<string, string>;
  readonly body?: string | Uint8Array;
  /** Statuses that are right for this input (every one a client error, or E2B's own answer for it). */
  readonly expect: readonly number[];
}

export interface CorpusResult {
  readonly case: CorpusCase;
  readonly status: number;
  /** The message the body carried (JSON `message`, Connect `message`, or text). */
  readonly message: string;
}

const deep = (depth: number) => `${"[".repeat(depth)}1${"]".repeat(depth)}`;
const json = { "Content-Type": "application/json" };

export function buildCorpus(t: CorpusTarget): CorpusCase[] {
  const cases: CorpusCase[] = [];
  const api = (name: string, method: string, path: string, body?: unknown, expect: number[] = [400], raw = false) =>
    cases.push({
      component: "api",
      name,
      method,
      url: `${t.apiUrl}${path}`,
      headers: { ...json, "X-API-KEY": t.apiKey },
      ...(body !== undefined ? { body: raw ? String(body) : JSON.stringify(body) } : {}),
      expect,
    });

  // Creates.
  api("create: body is not JSON", "POST", "/sandboxes", "{not json", [400], true);
  api("create: body is an array", "POST", "/sandboxes", [1, 2]);
  api("create: templateID is a number", "POST", "/sandboxes", { templateID: 5 });
  api("create: NUL in metadata key", "POST", "/sandboxes", { templateID: "base", metadata: { "a\u0000": "x" } });
  api("create: NUL in metadata value", "POST", "/sandboxes", { templateID: "base", metadata: { a: "x\u0000" } });
  api("create: NUL in env var value", "POST", "/sandboxes", { templateID: "base", envVars: { A: "\u0000" } });
  api("create: env var name with '='", "POST", "/sandboxes", { templateID: "base", envVars: { "A=B": "x" } });
  api("create: empty env var name", "POST", "/sandboxes", { templateID: "base", envVars: { "": "x" } });
  api(
    "create: metadata nested 5000 deep",
    "POST",
    "/sandboxes",
    `{"templateID":"base","metadata":${deep(5000)}}`,
    [400],
    true,
  );
  api(
    "create: unknown field nested deep",
    "POST",
    "/sandboxes",
    `{"templateID":"base","x":${deep(5000)}}`,
    [400],
    true,
  );
  api("create: negative timeout", "POST", "/sandboxes", { templateID: "base", timeout: -1 });
  api("create: timeout is a string", "POST", "/sandboxes", { templateID: "base", timeout: "soon" });
  api("create: timeout beyond 24 h", "POST", "/sandboxes", { templateID: "base", timeout: 90_000 });
  api("create: autoPause is a string", "POST", "/sandboxes", { templateID: "base", autoPause: "yes" });
  api("create: unknown template", "POST", "/sandboxes", { templateID: "no-such-template-x" }, [400, 404]);
  api("create: template name with NUL", "POST", "/sandboxes", { templateID: "ba\u0000se" }, [400, 404]);
  api("create: bad CIDR in network", "POST", "/sandboxes", {
    templateID: "base",
    network: { allowOut: ["300.1.2.3/40"] },
  });
  api("create: volume mount path relative", "POST", "/sandboxes", {
    templateID: "base",
    volumeMounts: [{ name: "v", path: "rel" }],
  });
  api("create: volumeMounts not an array", "POST", "/sandboxes", { templateID: "base", volumeMounts: "x" });
  api("create: mcp is a string", "POST", "/sandboxes", { templateID: "base", mcp: "x" });
  api("create: bad Idempotency-Key", "POST", "/sandboxes", { templateID: "base" }, [400]);
  cases[cases.length - 1] = {
    ...(cases[cases.length - 1] as CorpusCase),
    headers: { ...json, "X-API-KEY": t.apiKey, "Idempotency-Key": "k".repeat(300) },
  };

  // Lists and lookups.
  api("list: NUL in metadata filter", "GET", "/v2/sandboxes?metadata=a%3D%00");
  api("list: unknown state", "GET", "/v2/sandboxes?state=exploded");
  api("list: negative limit", "GET", "/v2/sandboxes?limit=-1");
  api("list: forged nextToken", "GET", "/v2/sandboxes?nextToken=Zm9yZ2Vk");
  api("list: startedAfter far before year 1", "GET", "/v2/sandboxes?startedAfter=-100000-01-01T00:00:00Z");
  api("lookup: id with path traversal", "GET", "/sandboxes/..%2F..%2Fetc", undefined, [400, 404]);
  api("lookup: id of 10000 characters", "GET", `/sandboxes/${"a".repeat(10_000)}`, undefined, [400, 404, 414, 431]);
  api("lookup: unknown sandbox", "GET", "/sandboxes/nosuchsandbox", undefined, [404]);
  api("timeout: body without timeout", "POST", `/sandboxes/${t.sandboxId}/timeout`, {});
  api("timeout: timeout is a string", "POST", `/sandboxes/${t.sandboxId}/timeout`, { timeout: "x" });
  api("snapshots: NUL in sandboxID filter", "GET", "/snapshots?sandboxID=%00");
  api("snapshot: name with spaces", "POST", `/sandboxes/${t.sandboxId}/snapshots`, { name: "a b" });
  api("metrics: start is not a number", "GET", `/sandboxes/${t.sandboxId}/metrics?start=soon`);

  // Templates, volumes, secrets.
  api("template: bad name", "POST", "/v3/templates", { name: "Bad Name!" });
  api("template: alias with NUL", "GET", "/templates/aliases/a%00b", undefined, [400, 404]);
  api("template: unknown build status", "GET", "/templates/nope/builds/nope/status", undefined, [400, 404]);
  api("volume: bad name", "POST", "/volumes", { name: "bad name" });
  api("volume: id not a UUID", "GET", "/volumes/not-a-uuid");
  api("secret: value is a number", "POST", "/secrets", { name: "x", value: 5 }, [400, 503]);

  // Authentication.
  cases.push({
    component: "api",
    name: "no API key",
    method: "GET",
    url: `${t.apiUrl}/v2/sandboxes`,
    expect: [401],
  });
  cases.push({
    component: "api",
    name: "admin path with a wrong token",
    method: "GET",
    url: `${t.apiUrl}/warren/v1/admin/teams`,
    headers: { "X-Admin-Token": "x".repeat(40) },
    expect: [401, 403],
  });
  cases.push({
    component: "api",
    name: "volume content with a forged token",
    method: "GET",
    url: `${t.apiUrl}/volumecontent/00000000-0000-4000-8000-000000000000/path?path=%2F`,
    headers: { Authorization: "Bearer forged" },
    expect: [401],
  });

  // The proxy: routing input (E2B answers an unknown sandbox with 502 and a JSON message).
  const proxy = (name: string, headers: Record<string, string>, expect: number[]) =>
    cases.push({ component: "proxy", name, method: "GET", url: `${t.proxyUrl}/health`, headers, expect });
  proxy("unknown sandbox id", { "E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": "49983" }, [502]);
  proxy("sandbox id with slashes", { "E2b-Sandbox-Id": "../../etc", "E2b-Sandbox-Port": "49983" }, [400, 502]);
  proxy("port out of range", { "E2b-Sandbox-Id": t.sandboxId, "E2b-Sandbox-Port": "70000" }, [400, 502]);
  proxy("port not a number", { "E2b-Sandbox-Id": t.sandboxId, "E2b-Sandbox-Port": "http" }, [400, 502]);
  proxy("Host that names no sandbox", { Host: "-.example" }, [400, 404, 502]);

  // envd through the proxy.
  const sandboxHeaders = (port: number) => ({
    "E2b-Sandbox-Id": t.sandboxId,
    "E2b-Sandbox-Port": String(port),
    "e2b-traffic-access-token": t.trafficAccessToken,
  });
  const envd = (
    name: string,
    method: string,
    path: string,
    expect: number[],
    extra: Record<string, string> = {},
    body?: string | Uint8Array,
  ) =>
    cases.push({
      component: "envd",
      name,
      method,
      url: `${t.proxyUrl}${path}`,
      headers: { ...sandboxHeaders(49983), "X-Access-Token": t.envdAccessToken, ...extra },
      ...(body !== undefined ? { body } : {}),
      expect,
    });
  envd("files: no access token", "GET", "/files?path=/etc/hostname", [401], { "X-Access-Token": "" });
  envd("files: wrong access token", "GET", "/files?path=/etc/hostname", [401], { "X-Access-Token": "wrong" });
  envd("files: read a missing file", "GET", "/files?path=/no/such/file", [404]);
  envd("files: read a directory", "GET", "/files?path=/etc", [400]);
  envd("files: unknown user", "GET", "/files?path=/etc/hostname&username=nobody-here", [400, 401]);
  envd(
    "files: write to /proc/sys",
    "POST",
    "/files?path=/proc/sys/kernel/hostname&username=root",
    [400, 403, 507],
    {},
    "x",
  );
  envd(
    "files: write into resolv.conf (read-only)",
    "POST",
    "/files?path=/etc/resolv.conf&username=root",
    [400, 403],
    {},
    "x",
  );
  const connect = (name: string, service: string, body: string, expect: number[], contentType = "application/json") =>
    envd(name, "POST", `/${service}`, expect, { "Content-Type": contentType, "Connect-Protocol-Version": "1" }, body);
  connect("Stat: body is not JSON", "filesystem.Filesystem/Stat", "{bad", [400]);
  connect("Stat: path with NUL", "filesystem.Filesystem/Stat", JSON.stringify({ path: "/a\u0000b" }), [400, 404]);
  connect(
    "MakeDir: under /proc/sys",
    "filesystem.Filesystem/MakeDir",
    JSON.stringify({ path: "/proc/sys/x" }),
    [400, 403, 404],
  );
  connect(
    "Stat: undecodable proto",
    "filesystem.Filesystem/Stat",
    "\u00ff\u00ff\u00ff\u00ff",
    [400],
    "application/proto",
  );

  // The code gateway through the proxy.
  const gateway = (name: string, path: string, body: string, expect: number[]) =>
    cases.push({
      component: "code-gateway",
      name,
      method: "POST",
      url: `${t.proxyUrl}${path}`,
      headers: { ...sandboxHeaders(49999), ...json, "X-Access-Token": t.envdAccessToken },
      body,
      expect,
    });
  gateway("execute: body is not JSON", "/execute", "{bad", [400]);
  gateway("execute: code missing", "/execute", "{}", [400]);
  gateway("execute: unknown language", "/execute", JSON.stringify({ code: "1", language: "cobol" }), [400]);
  gateway("execute: unknown context", "/execute", JSON.stringify({ code: "1", context_id: "nope" }), [400, 404]);
  gateway("contexts: unknown language", "/contexts", JSON.stringify({ language: "cobol" }), [400]);
  gateway("contexts: cwd not a string", "/contexts", JSON.stringify({ cwd: 5 }), [400]);
  return cases;
}

/** Sends every case; the message is whatever the body says (never the whole body: it may be big). */
export async function runCorpus(cases: readonly CorpusCase[]): Promise<CorpusResult[]> {
  const results: CorpusResult[] = [];
  for (const c of cases) {
    const res = await fetch(c.url, {
      method: c.method,
      ...(c.headers ? { headers: c.headers } : {}),
      ...(c.body !== undefined ? { body: c.body } : {}),
      signal: AbortSignal.timeout(20_000),
    });
    const text = await res.text();
    let message = text.slice(0, 300);
    try {
      const parsed = JSON.parse(text) as { message?: unknown };
      if (typeof parsed.message === "string") message = parsed.message;
    } catch {
      // not JSON: the text is the message
    }
    results.push({ case: c, status: res.status, message });
  }
  return results;
}
