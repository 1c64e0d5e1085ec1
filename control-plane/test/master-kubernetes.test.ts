/**
 * The master's Kubernetes mode against a fake API server (master-kubernetes-fake-api.ts) with the real PostgreSQL
 * and Redis: node agents found from their pods, cordon / NotReady / drain followed. What a real cluster would add
 * (kubelet, controllers, RBAC enforcement, TLS, a real node agent) is not here.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../src/master/log.js";
import { NodeAgentError } from "../src/master/node-agent-client.js";
import { Master } from "../src/master/server.js";
import { eventually, type FakeNodeAgent, TestEnv } from "./api-harness.js";
import {
  AGENT_LABELS,
  allowedByRbac,
  FakeKubernetesApi,
  kubernetesConfig,
  NAMESPACE,
  SELECTOR,
} from "./master-kubernetes-fake-api.js";

describe("master in Kubernetes mode: node agents and Nodes", () => {
  const env = new TestEnv();
  const fake = new FakeKubernetesApi();
  const dialled: { nodeId: string; addr: string }[] = [];
  let master: Master;
  let teamId: string;
  let refused = 0;

  const create = async () =>
    (
      await master.lifecycle.create({
        teamId,
        templateId: "base",
        timeoutSeconds: 600,
        metadata: {},
        envVars: {},
        autoPause: false,
        autoPauseMemory: true,
        autoResume: false,
        network: null,
        allowInternetAccess: null,
        volumeMounts: [],
      })
    ).sandbox.sandboxId;
  const rowOf = async (id: string) =>
    (await env.db.query<{ node_id: string; state: string }>("SELECT node_id, state FROM sandboxes WHERE id = $1", [id]))
      .rows[0];
  const placeable = async () => (await master.registry.placeableNodes()).map((n) => n.nodeId).sort();
  const untilPlaceable = (ids: string[]) =>
    eventually(async () => (JSON.stringify(await placeable()) === JSON.stringify(ids) ? true : undefined), `${ids}`);
  const drainEvents = async (sandboxId: string) =>
    (
      await env.db.query<{ data: { node: string; reason: string; outcome: string } }>(
        "SELECT data FROM sandbox_events WHERE sandbox_id = $1 AND type = 'sandbox.node_draining' ORDER BY id",
        [sandboxId],
      )
    ).rows.map((r) => r.data);

  beforeAll(async () => {
    await fake.listen();
    for (const node of ["node-a", "node-b", "node-c"]) fake.addNode(node);
    fake.addAgentPod(NAMESPACE, "wr-warren-node-agent-x7k2p", "node-a", "172.18.0.10", AGENT_LABELS);
    fake.addAgentPod(NAMESPACE, "wr-warren-node-agent-q9m4d", "node-b", "172.18.0.11", AGENT_LABELS);
    // Another release's agent in the same namespace must not be picked up.
    fake.addAgentPod(NAMESPACE, "other-warren-node-agent-zz", "node-c", "172.18.0.12", {
      ...AGENT_LABELS,
      "app.kubernetes.io/instance": "other",
    });
    for (const node of ["node-a", "node-b", "node-c"]) await env.addNode(node);
    process.env.KUBECONFIG = fake.kubeconfig(0, NAMESPACE);
    master = await Master.start({
      config: env.masterConfig({ kubernetes: kubernetesConfig() }),
      nodeAgent: (nodeId, addr) => {
        dialled.push({ nodeId, addr });
        const node = env.nodes.get(nodeId);
        if (!node) throw new NodeAgentError("unavailable", `unknown node ${nodeId}`);
        return node;
      },
      log: silentLogger,
    });
    env.masters.push(master);
    ({ teamId } = await env.team("kube"));
    await eventually(async () => (master.isLeader ? true : undefined), "leader");
  });
  afterAll(async () => {
    await env.stop();
    await fake.close();
  });

  it("discovers node agents from their pods: the address is pod IP + the `connect` container port", async () => {
    const live = new Map((await master.registry.liveNodes()).map((n) => [n.nodeId, n.addr]));
    expect(live.get("node-a")).toBe("172.18.0.10:49700");
    expect(live.get("node-b")).toBe("172.18.0.11:49700");
    // node-c heartbeats but has no agent pod of this release: it is live (kills, reconcile) but gets no sandboxes.
    expect(live.get("node-c")).toBe("127.0.0.1:7006");
    expect(await placeable()).toEqual(["node-a", "node-b"]);
    const id = await create();
    const row = await rowOf(id);
    expect(["node-a", "node-b"]).toContain(row?.node_id);
    expect(dialled).toContainEqual({
      nodeId: row?.node_id,
      addr: row?.node_id === "node-a" ? "172.18.0.10:49700" : "172.18.0.11:49700",
    });
    const podList = fake.requests.find((r) => r.method === "GET" && r.path.endsWith("/pods"));
    expect(podList?.path).toBe(`/api/v1/namespaces/${NAMESPACE}/pods`);
    expect(podList?.query.labelSelector).toBe(SELECTOR);
    expect(fake.requests.some((r) => r.method === "WATCH" && r.path === "/api/v1/nodes")).toBe(true);
  });

  it("picks up a new agent pod from the watch", async () => {
    fake.addAgentPod(NAMESPACE, "wr-warren-node-agent-c3v8n", "node-c", "172.18.0.12", AGENT_LABELS);
    await untilPlaceable(["node-a", "node-b", "node-c"]);
    expect((await master.registry.liveNodes()).find((n) => n.nodeId === "node-c")?.addr).toBe("172.18.0.12:49700");
  });

  it("cordon stops placement on the node; sandboxes already there keep running", async () => {
    const before = await create();
    const beforeNode = (await rowOf(before))?.node_id as string;
    fake.cordon(beforeNode);
    await untilPlaceable(["node-a", "node-b", "node-c"].filter((n) => n !== beforeNode));
    const placed = await Promise.all([create(), create(), create(), create()]);
    for (const id of placed) expect((await rowOf(id))?.node_id).not.toBe(beforeNode);
    // Several leader passes later the sandbox on the cordoned node is still running: cordon is not drain.
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await rowOf(before)).toEqual({ node_id: beforeNode, state: "running" });
    expect(await drainEvents(before)).toEqual([]);
    fake.uncordon(beforeNode);
    await untilPlaceable(["node-a", "node-b", "node-c"]);
  });

  it("a NotReady node gets no new sandboxes; Ready again, it does", async () => {
    fake.setReady("node-b", false);
    fake.cordon("node-c");
    await untilPlaceable(["node-a"]);
    for (const id of await Promise.all([create(), create()])) expect((await rowOf(id))?.node_id).toBe("node-a");
    fake.setReady("node-b", true);
    fake.uncordon("node-c");
    await untilPlaceable(["node-a", "node-b", "node-c"]);
  });

  it("uncordon resumes placement on the node", async () => {
    fake.cordon("node-a");
    fake.cordon("node-b");
    await untilPlaceable(["node-c"]);
    fake.uncordon("node-a");
    fake.uncordon("node-b");
    await untilPlaceable(["node-a", "node-b", "node-c"]);
    // Placement balances by reserved memory, and earlier tests left sandboxes on some nodes: keep creating until
    // the uncordoned nodes have been chosen again (each create adds to its node's load).
    const nodes = new Set<string>();
    for (let i = 0; i < 40 && nodes.size < 3; i++) nodes.add((await rowOf(await create()))?.node_id as string);
    expect([...nodes].sort()).toEqual(["node-a", "node-b", "node-c"]);
  });

  it("follows the API through a watch that ends, and through 410 Gone (relist)", async () => {
    const lists = () => fake.requests.filter((r) => r.method === "GET" && r.path === "/api/v1/nodes").length;
    const listsBefore = lists();
    fake.endWatches();
    fake.cordon("node-c");
    await untilPlaceable(["node-a", "node-b"]);
    // The change happens while no watch is open and history is compacted past the informers' resourceVersion:
    // their next watch gets 410 Gone and they must list again to see it.
    fake.endWatches();
    fake.uncordon("node-c");
    fake.compact();
    await untilPlaceable(["node-a", "node-b", "node-c"]);
    expect(lists()).toBeGreaterThan(listsBefore);
  });

  it("drain (a drain taint): pauses the node's running sandboxes and reports each in the ledger", async () => {
    fake.cordon("node-b");
    fake.cordon("node-c");
    await untilPlaceable(["node-a"]);
    const onA = [await create(), await create()];
    fake.uncordon("node-b");
    await untilPlaceable(["node-a", "node-b"]);
    fake.cordon("node-a");
    await untilPlaceable(["node-b"]);
    const onB = await create();
    fake.uncordon("node-c");
    fake.uncordon("node-a");

    fake.taint("node-a", "warren.dev/drain", "NoSchedule");
    for (const id of onA) {
      await eventually(async () => ((await drainEvents(id)).length > 0 ? true : undefined), `${id} reported`);
      expect((await rowOf(id))?.state).toBe("paused");
      expect(await drainEvents(id)).toEqual([{ node: "node-a", reason: "taint warren.dev/drain", outcome: "paused" }]);
      expect(env.nodes.get("node-a")?.sandboxes.get(id)?.state).toBe("paused");
    }
    expect(await placeable()).not.toContain("node-a");
    expect(await rowOf(onB)).toEqual({ node_id: "node-b", state: "running" });

    // Drain over: the paused sandboxes resume where their snapshot is (no move to another node).
    fake.untaint("node-a", "warren.dev/drain");
    await untilPlaceable(["node-a", "node-b", "node-c"]);
    await master.lifecycle.connect(onA[0] as string, teamId, 60, true);
    expect(await rowOf(onA[0] as string)).toEqual({ node_id: "node-a", state: "running" });
  });

  it("drain where the node cannot pause (evicted agent pod): reported once, left running", async () => {
    const nodeB = env.nodes.get("node-b") as FakeNodeAgent;
    fake.cordon("node-a");
    fake.cordon("node-c");
    await untilPlaceable(["node-b"]);
    const id = await create();
    fake.uncordon("node-a");
    fake.uncordon("node-c");
    nodeB.pause = async () => {
      throw new NodeAgentError("unimplemented", "pause is not supported by this driver");
    };
    // The Eviction API marks the pod DisruptionTarget, then deletes it (deletionTimestamp, grace period).
    fake.updatePod(NAMESPACE, "wr-warren-node-agent-q9m4d", (pod) => {
      pod.status.conditions.push({
        type: "DisruptionTarget",
        status: "True",
        reason: "EvictionByEvictionAPI",
        message: "Eviction API: evicting",
        lastProbeTime: null,
        lastTransitionTime: new Date().toISOString(),
      });
      pod.metadata.deletionTimestamp = new Date(Date.now() + 60_000).toISOString();
      pod.metadata.deletionGracePeriodSeconds = 60;
    });
    await eventually(async () => ((await drainEvents(id)).length > 0 ? true : undefined), "drain report");
    await new Promise((resolve) => setTimeout(resolve, 500));
    const events = await drainEvents(id);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({
      node: "node-b",
      reason: "agent pod EvictionByEvictionAPI",
      outcome: "not_paused",
    });
    expect(await rowOf(id)).toEqual({ node_id: "node-b", state: "running" });
    expect(await placeable()).toEqual(["node-a", "node-c"]);
  });

  it("a rolling update of an agent pod (plain delete, no DisruptionTarget) is not a drain", async () => {
    fake.cordon("node-a");
    fake.cordon("node-b");
    await untilPlaceable(["node-c"]);
    const id = await create();
    fake.uncordon("node-a");
    fake.uncordon("node-b");
    fake.deletePod(NAMESPACE, "wr-warren-node-agent-c3v8n");
    await eventually(async () => (!(await placeable()).includes("node-c") ? true : undefined), "node-c unplaceable");
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await rowOf(id)).toEqual({ node_id: "node-c", state: "running" });
    expect(await drainEvents(id)).toEqual([]);
    fake.addAgentPod(NAMESPACE, "wr-warren-node-agent-f5j1w", "node-c", "172.18.0.12", AGENT_LABELS);
    await eventually(async () => ((await placeable()).includes("node-c") ? true : undefined), "node-c back");
  });

  it("refuses to start when the API server refuses it, naming what failed", async () => {
    process.env.KUBECONFIG = fake.kubeconfig(0, NAMESPACE, "a-revoked-token");
    await expect(
      Master.start({
        config: env.masterConfig({ kubernetes: kubernetesConfig() }),
        nodeAgent: () => {
          throw new NodeAgentError("unavailable", "not used");
        },
        log: silentLogger,
      }),
    ).rejects.toThrow(/listing (pods|nodes) from the Kubernetes API failed: HTTP 401/);
    refused = fake.requests.filter((r) => r.status === 401).length;
    expect(refused).toBeGreaterThan(0);
  });

  it("sends only requests the chart's RBAC grants (KUBERNETES_ACCESS), authenticated", () => {
    expect(fake.requests.length).toBeGreaterThan(5);
    expect(fake.requests.filter((r) => !allowedByRbac(r))).toEqual([]);
    // The only unauthenticated requests were the revoked-token start above.
    expect(fake.requests.filter((r) => r.status === 401)).toHaveLength(refused);
  });
});
