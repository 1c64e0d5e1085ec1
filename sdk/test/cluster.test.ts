import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalCluster } from "../../e2e/src/cluster.js";
import { CommandExitError, Sandbox, SandboxNotFoundError } from "../src/index.js";

// Warren's SDK against a whole Warren cluster (api, master, node agent, proxy as separate processes):
// the REST methods and the event ledger for real, not against a recording server.
const dataDir = mkdtempSync(join(tmpdir(), "warren-sdk-cluster-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "s",
  nodeCidr: () => "10.218.0.0/22",
});
let opts: { apiKey: string; apiUrl: string; sandboxUrl: string };

beforeAll(async () => {
  const env = await cluster.start();
  opts = { apiKey: env.WARREN_API_KEY, apiUrl: env.WARREN_API_URL, sandboxUrl: env.WARREN_PROXY_URL };
}, 600_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("Warren's SDK against a whole cluster", () => {
  it("creates, lists, inspects, times out, pauses, resumes and kills through the real api", async () => {
    const sandbox = await Sandbox.create({ ...opts, metadata: { suite: "sdk-cluster" } });
    try {
      expect((await sandbox.commands.run("id -un")).stdout).toBe("user\n");
      await expect(sandbox.commands.run("exit 7")).rejects.toBeInstanceOf(CommandExitError);

      const info = await Sandbox.getInfo(sandbox.sandboxId, opts);
      expect(info.sandboxId).toBe(sandbox.sandboxId);
      expect(info.metadata).toEqual({ suite: "sdk-cluster" });
      const listed = await Sandbox.list({ ...opts, query: { metadata: { suite: "sdk-cluster" } } }).nextItems();
      expect(listed.map((s) => s.sandboxId)).toEqual([sandbox.sandboxId]);

      await sandbox.setTimeout(120_000);
      const endAt = (await Sandbox.getInfo(sandbox.sandboxId, opts)).endAt.getTime();
      expect(endAt).toBeGreaterThan(Date.now() + 100_000);

      await sandbox.files.write("kept.txt", "across pause");
      expect(await sandbox.pause()).toBe(true);
      expect(await sandbox.isRunning()).toBe(false);
      const resumed = await Sandbox.connect(sandbox.sandboxId, opts);
      expect(await resumed.files.read("kept.txt")).toBe("across pause");
    } finally {
      expect(await Sandbox.kill(sandbox.sandboxId, opts)).toBe(true);
    }
    expect(await Sandbox.kill(sandbox.sandboxId, opts)).toBe(false);
    await expect(Sandbox.connect(sandbox.sandboxId, opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
  });

  it("reads the sandbox's event ledger from the real api, by cursor", async () => {
    const sandbox = await Sandbox.create(opts);
    await sandbox.kill();
    const events = [];
    for await (const event of sandbox.events()) events.push(event);
    expect(events.map((e) => e.type)).toEqual(["sandbox.created", "sandbox.started", "sandbox.killed"]);
    const rest = [];
    for await (const event of sandbox.events({ cursor: events[0]?.id })) rest.push(event.type);
    expect(rest).toEqual(["sandbox.started", "sandbox.killed"]);
  });

  it("retrying a create with the same Idempotency-Key returns the same sandbox", async () => {
    const key = `sdk-cluster-${Date.now()}`;
    const headers = { "X-API-KEY": opts.apiKey, "Content-Type": "application/json", "Idempotency-Key": key };
    const body = JSON.stringify({ templateID: "base", timeout: 60 });
    const first = await fetch(`${opts.apiUrl}/v2/sandboxes`, { method: "POST", headers, body });
    const second = await fetch(`${opts.apiUrl}/v2/sandboxes`, { method: "POST", headers, body });
    const a = (await first.json()) as { sandboxID: string };
    const b = (await second.json()) as { sandboxID: string };
    expect(b.sandboxID).toBe(a.sandboxID);
    expect(await Sandbox.kill(a.sandboxID, opts)).toBe(true);
  });
});
