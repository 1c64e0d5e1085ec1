import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ClusterEnv, LocalCluster } from "../src/cluster.js";
import { waitFor } from "../src/services.js";

// Durable state: a paused sandbox and a snapshot outlive their node. After a pause the leader captures the paused
// sandbox and publishes it to the cluster's store (here the embedded OCI layout directory every node reads); once
// it is there the sandbox reports `durable`, and when its node is gone for good (agent stopped, state folder
// deleted) `connect` starts it on the other node from the store, same id and tokens, with its files.
const dataDir = mkdtempSync(join(tmpdir(), "warren-durable-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 2,
  poolSize: 1,
  instancePrefix: "f",
  nodeCidr: (i) => `10.250.${i * 4}.0/22`,
  env: { WARREN_NODE_DOWN_AFTER_MS: "3000", WARREN_RECONCILE_INTERVAL_MS: "1000" },
});
let env: ClusterEnv;
const created: Sandbox[] = [];

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

async function api(method: string, path: string, admin = false): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${env.WARREN_API_URL}${path}`, {
    method,
    headers: admin ? { "X-Admin-Token": env.WARREN_ADMIN_TOKEN } : { "X-API-KEY": env.E2B_API_KEY },
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

/** Snapshot ids the embedded store holds (its OCI index). */
function published(): string[] {
  try {
    const index = JSON.parse(readFileSync(join(dataDir, "store", "index.json"), "utf8")) as {
      manifests: { annotations?: Record<string, string> }[];
    };
    return index.manifests.map((m) => m.annotations?.["org.opencontainers.image.ref.name"] ?? "");
  } catch {
    return [];
  }
}

describe("durable state: paused sandboxes and snapshots outlive their node", () => {
  it("a paused sandbox resumes on another node after its node is gone; a snapshot is created there", async () => {
    // Everything starts on node-fa: node-fb is cordoned until node-fa is gone.
    expect(await cluster.cordon("node-fb", true)).toBe(204);
    const paused = await Sandbox.create("base", { timeoutMs: 300_000 });
    created.push(paused);
    const source = await Sandbox.create("base", { timeoutMs: 300_000 });
    created.push(source);
    expect(await cluster.nodeOf(paused.sandboxId)).toBe("node-fa");
    expect(await cluster.nodeOf(source.sandboxId)).toBe("node-fa");

    await paused.files.write("/home/user/keep.txt", "kept across nodes");
    await paused.commands.run("mkdir -p /home/user/deep/tree && echo leaf > /home/user/deep/tree/leaf");
    await source.files.write("/home/user/snap.txt", "from the snapshot");
    const snapshot = await source.createSnapshot({ name: "outlives" });
    expect(await paused.pause()).toBe(true);

    // Durable once the pause is in the store; the snapshot is published too.
    const detail = await waitFor(
      "the pause to be durable",
      async () => {
        const res = await api("GET", `/sandboxes/${paused.sandboxId}`);
        return (res.body as { durable?: boolean }).durable === true ? res.body : undefined;
      },
      60_000,
    );
    expect(detail).toMatchObject({ state: "paused", durable: true });
    await waitFor(
      "the snapshot to be published",
      async () => (published().some((id) => id.startsWith("s")) ? true : undefined),
      60_000,
    );
    const events = (await api("GET", `/warren/v1/sandboxes/${paused.sandboxId}/events`)).body as {
      events: { type: string }[];
    };
    expect(events.events.map((e) => e.type)).toContain("sandbox.durable");

    // node-fa is gone for good: stopped, its state folder (instances, snapshots) deleted.
    await cluster.removeNodeAgent(0);
    expect(await cluster.cordon("node-fb", false)).toBe(204);
    await waitFor(
      "node-fa to be down",
      async () => {
        const nodes = (await api("GET", "/warren/v1/admin/nodes", true)).body as { id: string; state: string }[];
        return nodes.find((n) => n.id === "node-fa")?.state === "down" ? true : undefined;
      },
      60_000,
    );
    // Still paused (not lost) while its node is down.
    expect((await api("GET", `/sandboxes/${paused.sandboxId}`)).body).toMatchObject({ state: "paused" });

    const resumed = await Sandbox.connect(paused.sandboxId, { timeoutMs: 120_000 });
    expect(await cluster.nodeOf(resumed.sandboxId)).toBe("node-fb");
    expect(await resumed.files.read("/home/user/keep.txt")).toBe("kept across nodes");
    expect((await resumed.commands.run("cat /home/user/deep/tree/leaf")).stdout).toBe("leaf\n");
    const moved = (await api("GET", `/warren/v1/sandboxes/${paused.sandboxId}/events`)).body as {
      events: { type: string; data: Record<string, unknown> }[];
    };
    expect(moved.events.find((e) => e.type === "sandbox.resumed")?.data).toMatchObject({
      movedFrom: "node-fa",
      node: "node-fb",
    });

    const child = await Sandbox.create(snapshot.snapshotId, { timeoutMs: 120_000 });
    created.push(child);
    expect(await cluster.nodeOf(child.sandboxId)).toBe("node-fb");
    expect(await child.files.read("/home/user/snap.txt")).toBe("from the snapshot");
  }, 300_000);
});
