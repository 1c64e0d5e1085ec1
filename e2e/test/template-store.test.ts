import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import type { ManagedChild } from "@warren/local/services";
import { Sandbox, Template } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRegistry } from "../src/registry.js";

// The template store with several nodes: two node agents publish to and pull from an OCI registry on loopback
// (Debian's docker-registry). A template built on one node starts sandboxes on the other, which pulls it from the
// registry (its digest checked) the first time.
const dataDir = mkdtempSync(join(tmpdir(), "warren-tstore-"));
let registry: { host: string; process: ManagedChild };
let cluster: LocalCluster;
let env: ClusterEnv;
const created: Sandbox[] = [];

beforeAll(async () => {
  registry = await startRegistry(join(dataDir, "registry"));
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 2,
    poolSize: 0,
    instancePrefix: "u",
    nodeCidr: (i) => `10.228.${i * 4}.0/22`,
    env: {
      WARREN_STORE: `docker://${registry.host}/warren`,
      WARREN_STORE_INSECURE: "1",
      WARREN_STORE_GC_INTERVAL_MS: "1000",
      // Layers no snapshot lists leave at a collection 20 s after their push (a publish pushes its layers first:
      // a shorter grace would take them from under a publish in progress).
      WARREN_STORE_LAYER_GRACE_MS: "20000",
    },
  });
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster?.stop();
  await registry?.process.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("the template store across nodes", () => {
  it("a template built on one node starts sandboxes on the other, pulled from the registry", async () => {
    const template = Template()
      .fromTemplate("base")
      .runCmd("echo portable > /opt/where && head -c 3000000 /dev/urandom > /opt/blob", { user: "root" })
      .setStartCmd("python3 -m http.server 8123 --bind 0.0.0.0", "curl -sf http://127.0.0.1:8123/ >/dev/null");
    const logs: string[] = [];
    await Template.build(template, "portable", { onBuildLogs: (e) => logs.push(e.message) });
    expect(logs.some((l) => l.includes("published to the store"))).toBe(true);
    // The registry holds the snapshots now.
    const catalog = (await (await fetch(`http://${registry.host}/v2/_catalog`)).json()) as { repositories: string[] };
    expect(catalog.repositories).toContain("warren/snapshots");

    const first = await Sandbox.create("portable", { timeoutMs: 120_000 });
    created.push(first);
    const builtOn = await cluster.nodeOf(first.sandboxId);
    expect(["node-ua", "node-ub"]).toContain(builtOn);
    const other = builtOn === "node-ua" ? "node-ub" : "node-ua";
    expect(await cluster.cordon(builtOn, true)).toBe(204);
    try {
      const moved = await Sandbox.create("portable", { timeoutMs: 120_000 });
      created.push(moved);
      expect(await cluster.nodeOf(moved.sandboxId)).toBe(other);
      expect((await moved.commands.run("cat /opt/where")).stdout.trim()).toBe("portable");
      expect((await moved.commands.run("stat -c %s /opt/blob")).stdout.trim()).toBe("3000000");
      const page = await moved.commands.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8123/");
      expect(page.stdout).toBe("200");
      // The second create there uses the copy it pulled.
      const again = await Sandbox.create("portable", { timeoutMs: 120_000 });
      created.push(again);
      expect(await cluster.nodeOf(again.sandboxId)).toBe(other);
    } finally {
      expect(await cluster.cordon(builtOn, false)).toBe(204);
    }
  }, 240_000);

  it("deleting the template removes its snapshots from the registry; its sandboxes keep running", async () => {
    const tags = async () => {
      const res = await fetch(`http://${registry.host}/v2/warren/snapshots/tags/list`);
      if (res.status === 404) return [];
      return (((await res.json()) as { tags: string[] | null }).tags ?? []).sort();
    };
    const published = await tags();
    // The ready snapshot (t…) and the layer of its RUN step (l…).
    expect(published.some((t) => t.startsWith("t"))).toBe(true);
    expect(published.some((t) => t.startsWith("l"))).toBe(true);
    const running = created[0] as Sandbox;
    const removed = await fetch(`${env.E2B_API_URL}/templates/portable`, {
      method: "DELETE",
      headers: { "X-API-KEY": env.E2B_API_KEY },
    });
    expect(removed.status).toBe(204);
    const deadline = Date.now() + 60_000;
    while ((await tags()).length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 500));
    expect(await tags()).toEqual([]);
    expect((await running.commands.run("cat /opt/where")).stdout.trim()).toBe("portable");
  }, 120_000);
});
