import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DATABASE_URL, eventually, REDIS_URL } from "./api-harness.js";

const dist = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../dist");

/** The api and master entry points as separate processes: start, serve, log JSON without secrets, stop on SIGTERM. */
describe("api and master processes", () => {
  const schema = `t_${randomBytes(6).toString("hex")}`;
  const adminToken = randomBytes(24).toString("hex");
  let apiUrl = "";
  const logs = { api: "", master: "" };
  let master: ChildProcess;
  let api: ChildProcess;

  const env = {
    ...process.env,
    DATABASE_URL,
    REDIS_URL,
    WARREN_DB_SCHEMA: schema,
    WARREN_REDIS_PREFIX: `wt-${schema}:`,
    WARREN_TOKEN_SECRET: randomBytes(24).toString("hex"),
    WARREN_ADMIN_TOKEN: adminToken,
    WARREN_MASTER_PORT: "0",
    WARREN_API_PORT: "0",
  };

  /** The `url` of the first log line with this message (the processes listen on port 0). */
  const listeningUrl = (output: string, msg: string): string | undefined => {
    for (const line of output.split("\n")) {
      if (!line.includes(msg)) continue;
      return (JSON.parse(line) as { url?: string }).url;
    }
    return undefined;
  };

  const exited = (child: ChildProcess) =>
    new Promise<number | null>((resolve) => {
      if (child.exitCode !== null) resolve(child.exitCode);
      else child.once("exit", (code) => resolve(code));
    });

  beforeAll(async () => {
    master = spawn(process.execPath, [path.join(dist, "master/main.js")], { env, stdio: ["ignore", "ignore", "pipe"] });
    master.stderr?.on("data", (chunk) => {
      logs.master += chunk;
    });
    const masterUrl = await eventually(async () => {
      if (master.exitCode !== null) throw new Error(`master exited: ${logs.master}`);
      return listeningUrl(logs.master, "master listening");
    }, "master start");
    api = spawn(process.execPath, [path.join(dist, "api/main.js")], {
      env: { ...env, WARREN_MASTER_URL: masterUrl },
      stdio: ["ignore", "ignore", "pipe"],
    });
    api.stderr?.on("data", (chunk) => {
      logs.api += chunk;
    });
    apiUrl = await eventually(async () => {
      if (api.exitCode !== null) throw new Error(`api exited: ${logs.api}`);
      return listeningUrl(logs.api, "api listening");
    }, "api start");
  });

  afterAll(async () => {
    for (const child of [api, master]) if (child && child.exitCode === null) child.kill("SIGKILL");
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  });

  it("serves the REST surface, logs one JSON object per line without keys or tokens, and stops on SIGTERM", async () => {
    const base = apiUrl;
    const teamRes = await fetch(`${base}/warren/v1/admin/teams`, {
      method: "POST",
      headers: { "X-Admin-Token": adminToken, "Content-Type": "application/json" },
      body: JSON.stringify({ name: "proc" }),
    });
    expect(teamRes.status).toBe(201);
    const { apiKey } = (await teamRes.json()) as { apiKey: { key: string } };
    const list = await fetch(`${base}/v2/sandboxes`, { headers: { "X-API-KEY": apiKey.key } });
    expect(list.status).toBe(200);
    // No node agent heartbeats here: the master answers, the api maps it to 503.
    const create = await fetch(`${base}/v2/sandboxes`, {
      method: "POST",
      headers: { "X-API-KEY": apiKey.key, "Content-Type": "application/json" },
      body: JSON.stringify({ templateID: "base", envVars: { SECRET_VALUE: "hunter2" } }),
    });
    expect(create.status).toBe(503);
    api.kill("SIGTERM");
    master.kill("SIGTERM");
    expect(await exited(api)).toBe(0);
    expect(await exited(master)).toBe(0);
    for (const output of [logs.api, logs.master]) {
      for (const line of output.trim().split("\n")) expect(() => JSON.parse(line)).not.toThrow();
      expect(output).not.toContain(apiKey.key);
      expect(output).not.toContain(adminToken);
      expect(output).not.toContain("hunter2");
    }
    expect(logs.api).toContain('"route":"/v2/sandboxes"');
  });
});
