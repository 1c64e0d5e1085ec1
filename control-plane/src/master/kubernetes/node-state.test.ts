import type { V1Node, V1Pod } from "@kubernetes/client-node";
import { describe, expect, it } from "vitest";
import { loadMasterConfig } from "../config.js";
import { addrHost, agentPod, agentVerdict, nodeState } from "./node-state.js";

const DRAIN = ["warren.dev/drain", "ToBeDeletedByClusterAutoscaler"];

function node(fields: { unschedulable?: boolean; ready?: string; taints?: string[] } = {}): V1Node {
  return {
    metadata: { name: "n1" },
    spec: {
      ...(fields.unschedulable ? { unschedulable: true } : {}),
      ...(fields.taints ? { taints: fields.taints.map((key) => ({ key, effect: "NoSchedule" })) } : {}),
    },
    status: { conditions: [{ type: "Ready", status: fields.ready ?? "True" }] },
  };
}

function pod(fields: { ready?: boolean; deleting?: boolean; disruption?: string; ip?: string } = {}): V1Pod {
  const ip = fields.ip ?? "10.0.0.5";
  return {
    metadata: { name: "agent-x", ...(fields.deleting ? { deletionTimestamp: new Date() } : {}) },
    spec: { nodeName: "n1", containers: [{ name: "node-agent", ports: [{ name: "connect", containerPort: 49700 }] }] },
    status: {
      phase: "Running",
      podIP: ip,
      hostIP: ip,
      conditions: [
        { type: "Ready", status: fields.ready === false ? "False" : "True" },
        ...(fields.disruption ? [{ type: "DisruptionTarget", status: "True", reason: fields.disruption }] : []),
      ],
    },
  };
}

const verdictOf = (pods: V1Pod[], n: V1Node = node()) =>
  agentVerdict(
    pods.map((p) => agentPod(p, "connect")),
    new Map([["n1", nodeState(n, DRAIN)]]),
  );

describe("node agent verdicts from pods and Nodes", () => {
  it("a Ready agent pod on a Ready, schedulable node takes sandboxes at pod IP:connect port", () => {
    expect(verdictOf([pod()])).toEqual({ addr: "10.0.0.5:49700", pod: "agent-x", node: "n1" });
    expect(agentPod(pod({ ip: "fd00::5" }), "connect").addr).toBe("[fd00::5]:49700");
    expect(agentPod(pod(), 50000).addr).toBe("10.0.0.5:50000");
  });

  it("cordon and NotReady (False or Unknown) stop placement without draining", () => {
    expect(verdictOf([pod()], node({ unschedulable: true }))).toMatchObject({ unplaceable: "node_cordoned" });
    expect(verdictOf([pod()], node({ ready: "Unknown" }))).toMatchObject({ unplaceable: "node_not_ready" });
    expect(verdictOf([pod()], node({ ready: "False" })).drain).toBeUndefined();
    // Kubernetes adds this taint for every cordon: it is not a drain by itself.
    expect(
      verdictOf([pod()], node({ unschedulable: true, taints: ["node.kubernetes.io/unschedulable"] })).drain,
    ).toBeUndefined();
  });

  it("a drain taint or a disrupted (evicted) agent pod drains; a plain delete (rolling update) does not", () => {
    expect(verdictOf([pod()], node({ taints: ["ToBeDeletedByClusterAutoscaler"] }))).toMatchObject({
      unplaceable: "node_draining",
      drain: "taint ToBeDeletedByClusterAutoscaler",
    });
    expect(verdictOf([pod({ deleting: true, disruption: "EvictionByEvictionAPI" })])).toMatchObject({
      unplaceable: "node_draining",
      drain: "agent pod EvictionByEvictionAPI",
    });
    const rolling = verdictOf([pod({ deleting: true })]);
    expect(rolling).toMatchObject({ unplaceable: "agent_pod_terminating" });
    expect(rolling.drain).toBeUndefined();
    // The DaemonSet already replaced the evicted pod: the agent stays, nothing to drain.
    expect(
      verdictOf([pod({ deleting: true, disruption: "EvictionByEvictionAPI" }), pod({ ip: "10.0.0.5" })]).drain,
    ).toBeUndefined();
  });

  it("no pod, an unready pod, or an unknown Node: no new sandboxes", () => {
    expect(verdictOf([])).toMatchObject({ unplaceable: "agent_pod_missing" });
    expect(verdictOf([pod({ ready: false })])).toMatchObject({ unplaceable: "agent_pod_not_ready" });
    expect(agentVerdict([agentPod(pod(), "connect")], new Map())).toMatchObject({ unplaceable: "node_unknown" });
  });

  it("reads host:port addresses", () => {
    expect(addrHost("10.0.0.5:49700")).toBe("10.0.0.5");
    expect(addrHost("[fd00::5]:49700")).toBe("fd00::5");
    expect(addrHost("node-1.example:1")).toBe("node-1.example");
  });
});

describe("WARREN_KUBERNETES configuration", () => {
  const base = { WARREN_TOKEN_SECRET: "0123456789abcdef0123" };
  const on = {
    ...base,
    WARREN_KUBERNETES: "in-cluster",
    WARREN_KUBERNETES_NAMESPACE: "warren",
    WARREN_KUBERNETES_AGENT_SELECTOR: "app.kubernetes.io/component=node-agent",
  };

  it("is off by default, and on with documented defaults", () => {
    expect(loadMasterConfig(base).kubernetes).toBeUndefined();
    expect(loadMasterConfig({ ...base, WARREN_KUBERNETES: "off" }).kubernetes).toBeUndefined();
    expect(loadMasterConfig({ ...on, WARREN_KUBERNETES_IDENTITY: "pod-1" }).kubernetes).toEqual({
      mode: "in-cluster",
      namespace: "warren",
      agentSelector: "app.kubernetes.io/component=node-agent",
      agentPort: "connect",
      leaseName: "warren-master",
      leaseSeconds: 15,
      identity: "pod-1",
      drainTaints: ["warren.dev/drain", "ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"],
    });
    expect(loadMasterConfig({ ...on, WARREN_KUBERNETES_AGENT_PORT: "49700" }).kubernetes?.agentPort).toBe(49700);
  });

  it("refuses what cannot work, naming the variable", () => {
    expect(() => loadMasterConfig({ ...base, WARREN_KUBERNETES: "yes" })).toThrow("WARREN_KUBERNETES");
    expect(() => loadMasterConfig({ ...on, WARREN_KUBERNETES_NAMESPACE: "" })).toThrow("WARREN_KUBERNETES_NAMESPACE");
    expect(() => loadMasterConfig({ ...on, WARREN_KUBERNETES_AGENT_SELECTOR: " " })).toThrow("AGENT_SELECTOR");
    expect(() => loadMasterConfig({ ...on, WARREN_KUBERNETES_LEASE_SECONDS: "5" })).toThrow("LEASE_SECONDS");
    expect(() => loadMasterConfig({ ...on, WARREN_KUBERNETES_LEASE_SECONDS: "1.5" })).toThrow("LEASE_SECONDS");
    expect(() => loadMasterConfig({ ...on, WARREN_KUBERNETES_AGENT_PORT: "70000" })).toThrow("AGENT_PORT");
  });
});
