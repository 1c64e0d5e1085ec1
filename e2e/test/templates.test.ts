import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { Sandbox, Template, waitForPort } from "e2b";
import { Redis } from "ioredis";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkpointTier } from "../src/host-capabilities.js";

// Custom templates through the whole cluster, driven by the official e2b SDK's `Template` builder: E2B's build
// API (create, files handshake and upload, trigger, status with logs), steps run in a build sandbox, step layers
// cached by E2B's key chain, the ready snapshot (with the start process in memory where CRIU works, else started
// at every create), names, tags, aliases, tenancy and failures.
const dataDir = mkdtempSync(join(tmpdir(), "warren-tpl-"));
const contextDir = mkdtempSync(join(tmpdir(), "warren-tpl-ctx-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "w",
  nodeCidr: () => "10.224.0.0/22",
  // The master restarts under a build the SDK follows through the api: the api must stay up meanwhile.
  separateMaster: true,
  // Small enough for a test to go over it; one build at a time on the node, so a second one queues.
  env: { WARREN_TEMPLATE_UPLOAD_MAX_BYTES: String(1 << 20), WARREN_BUILD_CONCURRENCY: "1" },
});
let env: ClusterEnv;
let apiKeyB: string;
const created: Sandbox[] = [];

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
  const res = await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams`, {
    method: "POST",
    headers: { "X-Admin-Token": env.WARREN_ADMIN_TOKEN, "Content-Type": "application/json" },
    body: JSON.stringify({ name: "team-b" }),
  });
  apiKeyB = ((await res.json()) as { apiKey: { key: string } }).apiKey.key;
  writeFileSync(join(contextDir, "hello.txt"), "hello from the context\n", { mode: 0o644 });
}, 600_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(contextDir, { recursive: true, force: true });
}, 120_000);

/** The sandbox ids of the instances on the node agent's disk (build sandboxes have no row in the database). */
function instanceSandboxIds(): string[] {
  const dir = join(dataDir, "agent-wa", "instances");
  return readdirSync(dir).flatMap((name) => {
    const file = join(dir, name, "instance.json");
    if (!existsSync(file)) return [];
    return [(JSON.parse(readFileSync(file, "utf8")) as { labels: Record<string, string> }).labels.sandboxId ?? ""];
  });
}

async function sandbox(template: string): Promise<Sandbox> {
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000 });
  created.push(sbx);
  return sbx;
}

const run = async (sbx: Sandbox, cmd: string, user: "root" | "user" = "user") =>
  (await sbx.commands.run(cmd, { user })).stdout.trim();

async function build(template: Parameters<typeof Template.build>[0], name: string) {
  const logs: string[] = [];
  const info = await Template.build(template, name, { onBuildLogs: (entry) => logs.push(entry.message) });
  return { info, logs };
}

function app(startStamp = "v1") {
  return Template({ fileContextPath: contextDir })
    .fromTemplate("base")
    .runCmd("date +%s%N > /opt/stamp && echo stamped", { user: "root" })
    .copy("hello.txt", "/app/", { user: "user", mode: 0o640 })
    .setEnvs({ GREETING: "hi from $HOME" })
    .setWorkdir("/app")
    .runCmd(`echo ${startStamp} > /app/version`, { user: "root" })
    .setUser("user")
    .setStartCmd("python3 -m http.server 8000 --bind 0.0.0.0", waitForPort(8000));
}

describe("custom templates with the official SDK", () => {
  it("builds from base with RUN, COPY (user, mode), ENV, WORKDIR, USER and a start command; a sandbox sees each step and serves the port at once", async () => {
    const { info, logs } = await build(app(), "webapp");
    expect(info.templateId).toMatch(/^[a-z0-9]{20}$/);
    expect(info.buildId).toMatch(/^[0-9a-f-]{36}$/);
    expect(logs.some((l) => l.includes("RUN date"))).toBe(true);
    expect(logs.some((l) => l.includes("[stdout]: stamped"))).toBe(true);
    expect(logs.at(-1)).toMatch(/^Build finished/);

    const sbx = await sandbox("webapp");
    expect(sbx.sandboxId).toBeTruthy();
    expect(await run(sbx, "cat /app/hello.txt")).toBe("hello from the context");
    expect(await run(sbx, "stat -c '%U %a' /app/hello.txt")).toBe("user 640");
    expect(await run(sbx, "cat /app/version")).toBe("v1");
    expect(await run(sbx, "pwd")).toBe("/app");
    expect(await run(sbx, "whoami")).toBe("user");
    expect(await run(sbx, "echo $GREETING")).toBe("hi from /root");
    // The start process answers right after create, without any wait of ours.
    expect(await run(sbx, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/")).toBe("200");
    const info2 = await Sandbox.getInfo(sbx.sandboxId);
    expect(info2.templateId).toBe(info.templateId);
    expect(info2.name).toBe("webapp");
  }, 240_000);

  it("keeps the start process from the ready snapshot where CRIU works (same pid), else starts it at create", async () => {
    const a = await sandbox("webapp");
    const b = await sandbox("webapp");
    const pidA = await run(a, "pgrep -f 'http.server 8000' | head -1");
    const pidB = await run(b, "pgrep -f 'http.server 8000' | head -1");
    expect(pidA).toMatch(/^\d+$/);
    if (checkpointTier().usable) expect(pidB).toBe(pidA);
    else expect(pidB).toMatch(/^\d+$/);
  }, 240_000);

  it("an unchanged rebuild runs no step (every step CACHED, the RUN's timestamp unchanged); one changed step reruns only it and the ones after", async () => {
    const first = await sandbox("webapp");
    const stamp = await run(first, "cat /opt/stamp");

    const again = await build(app(), "webapp");
    const cached = again.logs.filter((l) => l.startsWith("CACHED "));
    expect(cached.length).toBe(6);
    expect(again.logs.some((l) => l.includes("[stdout]: stamped"))).toBe(false);
    const second = await sandbox("webapp");
    expect(await run(second, "cat /opt/stamp")).toBe(stamp);

    const changed = await build(app("v2"), "webapp");
    expect(changed.logs.filter((l) => l.startsWith("CACHED ")).length).toBe(4);
    expect(changed.logs.some((l) => /\[builder 5\/6\] RUN echo v2/.test(l))).toBe(true);
    const third = await sandbox("webapp");
    expect(await run(third, "cat /app/version")).toBe("v2");
    expect(await run(third, "cat /opt/stamp")).toBe(stamp);
  }, 240_000);

  it("child templates stack on a team template (fromTemplate) and inherit its start command", async () => {
    const child = Template().fromTemplate("webapp").runCmd("echo child > /app/child", { user: "root" });
    await build(child, "webapp-child");
    const sbx = await sandbox("webapp-child");
    expect(await run(sbx, "cat /app/child /app/version")).toBe("child\nv2");
    expect(await run(sbx, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/")).toBe("200");
  }, 240_000);

  it("answers exists, tags, names with tags and listings as E2B does", async () => {
    expect(await Template.exists("webapp")).toBe(true);
    expect(await Template.exists("no-such-template")).toBe(false);
    expect(await Template.exists("base")).toBe(true);
    const tagged = await Template.build(
      Template().fromTemplate("base").runCmd("echo one > /one", { user: "root" }),
      "tagged:v1",
    );
    expect(tagged.tags).toContain("v1");
    expect(await Template.exists("tagged:v1")).toBe(true);
    expect(await Template.exists("tagged:v9")).toBe(false);
    const assigned = await Template.assignTags("tagged:v1", ["stable"]);
    expect(assigned.buildId).toBe(tagged.buildId);
    const tags = await Template.getTags("tagged");
    expect(tags.map((t) => t.tag).sort()).toEqual(["stable", "v1"]);
    const fromTag = await sandbox("tagged:stable");
    expect(await run(fromTag, "cat /one")).toBe("one");
    await Template.removeTags("tagged", ["stable"]);
    expect((await Template.getTags("tagged")).map((t) => t.tag)).toEqual(["v1"]);
    await expect(Sandbox.create("tagged:stable")).rejects.toThrow(/stable/);

    const list = (await (
      await fetch(`${env.E2B_API_URL}/templates`, { headers: { "X-API-KEY": env.E2B_API_KEY } })
    ).json()) as { aliases: string[]; buildStatus: string }[];
    expect(list.map((t) => t.aliases[0])).toEqual(expect.arrayContaining(["webapp", "webapp-child", "tagged"]));
  }, 240_000);

  it("keeps another team's private template out of reach (404 on create, not listed, 404 on status)", async () => {
    await expect(Sandbox.create("webapp", { apiKey: apiKeyB })).rejects.toThrow(/not found|404/i);
    const list = (await (
      await fetch(`${env.E2B_API_URL}/templates`, { headers: { "X-API-KEY": apiKeyB } })
    ).json()) as unknown[];
    expect(list).toEqual([]);
    expect(await Template.exists("webapp", { apiKey: apiKeyB })).toBe(false);
  }, 240_000);

  it("a failing RUN ends the build in error naming the step and leaves no build sandbox and no layer for it", async () => {
    const failing = Template().fromTemplate("base").runCmd("echo before").runCmd("echo doomed >&2; exit 3");
    const error = await Template.build(failing, "broken").catch((e: unknown) => e as Error);
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).message).toMatch(/exit status 3|exit code 3/);
    const db = new pg.Client({ connectionString: cluster.databaseUrl });
    await db.connect();
    try {
      await db.query(`SET search_path TO ${cluster.dbSchema}`);
      const builds = await db.query(
        "SELECT b.status, b.reason FROM template_builds b JOIN templates t ON t.id = b.template_id WHERE t.alias = 'broken'",
      );
      expect(builds.rows[0]?.status).toBe("error");
      expect(builds.rows[0]?.reason.step).toBe("2");
      const layerKeys = await db.query(
        "SELECT layer_keys FROM template_builds b JOIN templates t ON t.id = b.template_id WHERE t.alias = 'broken'",
      );
      expect((layerKeys.rows[0]?.layer_keys as string[]).length).toBe(1);
    } finally {
      await db.end();
    }
    // No build sandbox stays on the node: no route of one is left in Redis.
    const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
    try {
      expect(await redis.keys("warren:route:b*")).toEqual([]);
    } finally {
      redis.disconnect();
    }
  }, 240_000);

  it("answers bad input with 4xx and a message", async () => {
    const api = (path: string, init: RequestInit = {}) =>
      fetch(`${env.E2B_API_URL}${path}`, {
        ...init,
        headers: { "X-API-KEY": env.E2B_API_KEY, "Content-Type": "application/json", ...(init.headers ?? {}) },
      });
    const badName = await api("/v3/templates", { method: "POST", body: JSON.stringify({ name: "Bad Name!" }) });
    expect(badName.status).toBe(400);
    expect(((await badName.json()) as { message: string }).message).toMatch(/Invalid name/);
    const foreignNs = await api("/v3/templates", { method: "POST", body: JSON.stringify({ name: "other/x" }) });
    expect(foreignNs.status).toBe(400);
    const created = (await (
      await api("/v3/templates", { method: "POST", body: JSON.stringify({ name: "bad-input" }) })
    ).json()) as { templateID: string; buildID: string };
    const trigger = (body: unknown) =>
      api(`/v2/templates/${created.templateID}/builds/${created.buildID}`, {
        method: "POST",
        body: JSON.stringify(body),
      });
    const unknownStep = await trigger({ fromTemplate: "base", steps: [{ type: "FLY", args: [], force: false }] });
    expect(unknownStep.status).toBe(400);
    expect(((await unknownStep.json()) as { message: string }).message).toMatch(/FLY is not implemented/);
    const outside = await trigger({
      fromTemplate: "base",
      steps: [{ type: "COPY", args: ["../etc/passwd", "/x"], force: false, filesHash: "a".repeat(64) }],
    });
    // Accepted by the api (the path is the SDK's), refused by the builder before anything runs.
    expect(outside.status).toBe(202);
    const status = await waitForStatus(created.templateID, created.buildID);
    expect(status.status).toBe("error");
    expect(status.reason?.message).toMatch(/outside the build context/);
    const badHash = await api(`/templates/${created.templateID}/files/nothex`);
    expect(badHash.status).toBe(400);
    const link = (await (await api(`/templates/${created.templateID}/files/${"b".repeat(64)}`)).json()) as {
      present: boolean;
      url: string;
    };
    expect(link.present).toBe(false);
    const notTar = await fetch(link.url, { method: "PUT", body: "definitely not a tar" });
    expect(notTar.status).toBe(400);
    const bigLink = (await (await api(`/templates/${created.templateID}/files/${"d".repeat(64)}`)).json()) as {
      url: string;
    };
    const tooBig = await fetch(bigLink.url, { method: "PUT", body: Buffer.alloc(2 << 20) });
    expect(tooBig.status).toBe(413);
    expect(((await tooBig.json()) as { message: string }).message).toMatch(/larger than the limit of 1048576 bytes/);
  }, 240_000);

  it("deletes a template: its name is free again and a sandbox made from it keeps running", async () => {
    await build(Template().fromTemplate("base").runCmd("echo gone > /gone", { user: "root" }), "doomed");
    const sbx = await sandbox("doomed");
    const res = await fetch(`${env.E2B_API_URL}/templates/doomed`, {
      method: "DELETE",
      headers: { "X-API-KEY": env.E2B_API_KEY },
    });
    expect(res.status).toBe(204);
    expect(await Template.exists("doomed")).toBe(false);
    await expect(Sandbox.create("doomed")).rejects.toThrow();
    expect(await run(sbx, "cat /gone")).toBe("gone");
  }, 240_000);

  it("queues a build beyond the node's build slots (WARREN_BUILD_CONCURRENCY=1): it waits its turn, the two never overlap, both finish", async () => {
    const timed = (tag: string) =>
      Template()
        .fromTemplate("base")
        .runCmd(`date +%s%N > /opt/began && sleep 2 && date +%s%N > /opt/ended && echo ${tag}`, { user: "root" });
    const builds = await Promise.all([build(timed("first"), "queued-a"), build(timed("second"), "queued-b")]);
    const waited = builds.map(({ logs }) => logs.some((line) => line.includes("waiting for a build slot")));
    expect(waited.filter(Boolean)).toHaveLength(1);
    const spans: [number, number][] = [];
    for (const name of ["queued-a", "queued-b"]) {
      const sbx = await sandbox(name);
      const [began, ended] = (await run(sbx, "cat /opt/began /opt/ended")).split("\n").map(Number);
      spans.push([began as number, ended as number]);
    }
    const [[aBegan, aEnded], [bBegan, bEnded]] = spans as [[number, number], [number, number]];
    // The queued build's step ran only after the other build's step had ended (and the other way round).
    expect(aEnded < bBegan || bEnded < aBegan).toBe(true);
  }, 240_000);

  it("a build whose master restarts mid-build is handed over and finished by the new master, its finished steps from the cache", async () => {
    const template = Template()
      .fromTemplate("base")
      .runCmd("date +%s%N > /opt/first", { user: "root" })
      .runCmd("sleep 6 && echo second > /opt/second", { user: "root" });
    const logs: string[] = [];
    const built = Template.build(template, "handed-over", { onBuildLogs: (entry) => logs.push(entry.message) });
    // Once the first step is done and the second one runs.
    for (let i = 0; i < 600 && !logs.some((line) => line.includes("sleep 6")); i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(logs.some((line) => line.includes("sleep 6"))).toBe(true);
    await cluster.restartMaster();
    const { buildId } = await built;
    const text = logs.join("\n");
    expect(text).toContain("this master is stopping; the build goes to another master");
    expect(text).toContain("another master continues it (takeover 1 of at most 2");
    expect(logs.filter((line) => line.startsWith("CACHED [builder 1/2]"))).toHaveLength(1);
    expect(logs.filter((line) => line.startsWith("CACHED [builder 2/2]"))).toHaveLength(0);
    const sbx = await sandbox("handed-over");
    expect(await run(sbx, "cat /opt/second")).toBe("second");
    expect(await run(sbx, "test -s /opt/first && echo yes")).toBe("yes");
    // Neither run's build sandbox is left on the node.
    const prefix = `b${buildId.replaceAll("-", "")}`;
    expect(instanceSandboxIds().filter((id) => id.startsWith(prefix))).toEqual([]);
  }, 240_000);

  it("a build whose master is killed mid-build is continued by the next master at once (its liveness lock went with it)", async () => {
    const template = Template()
      .fromTemplate("base")
      // Steps of their own (the test above cached its steps: the same ones would all be CACHED here).
      .runCmd("date +%s%N > /opt/first-k", { user: "root" })
      .runCmd("sleep 6 && echo killed > /opt/second", { user: "root" });
    const logs: string[] = [];
    const built = Template.build(template, "killed-master", { onBuildLogs: (entry) => logs.push(entry.message) });
    for (let i = 0; i < 600 && !logs.some((line) => line.includes("sleep 6")); i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(logs.some((line) => line.includes("sleep 6"))).toBe(true);
    const killedAt = Date.now();
    await cluster.restartMaster("SIGKILL");
    const { buildId } = await built;
    // The dead master's heartbeat alone would make the build abandoned only after a minute: it was continued as soon
    // as the new master's first pass saw no session holding the old one's liveness lock.
    expect(Date.now() - killedAt).toBeLessThan(50_000);
    const text = logs.join("\n");
    expect(text).not.toContain("this master is stopping");
    expect(text).toContain("another master continues it (takeover 1 of at most 2");
    expect(logs.filter((line) => line.startsWith("CACHED [builder 1/2]"))).toHaveLength(1);
    const sbx = await sandbox("killed-master");
    expect(await run(sbx, "cat /opt/second")).toBe("killed");
    // The dead master's build sandbox was removed by the taker.
    const prefix = `b${buildId.replaceAll("-", "")}`;
    expect(instanceSandboxIds().filter((id) => id.startsWith(prefix))).toEqual([]);
  }, 240_000);
});

async function waitForStatus(templateId: string, buildId: string) {
  for (let i = 0; i < 100; i++) {
    const res = await fetch(`${env.E2B_API_URL}/templates/${templateId}/builds/${buildId}/status`, {
      headers: { "X-API-KEY": env.E2B_API_KEY },
    });
    const body = (await res.json()) as { status: string; reason?: { message: string; step?: string } };
    if (body.status === "ready" || body.status === "error") return body;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error("build did not end");
}
