import type { V1Node, V1Pod } from "@kubernetes/client-node";

/**
 * What the Kubernetes objects say about one node agent, reduced to what placement and draining need. Pure
 * functions over V1Node / V1Pod, so the rules are tested without an API server.
 */

/** Why a node takes no new sandboxes, or undefined when it may. */
export type Unplaceable =
  | "node_unknown"
  | "node_cordoned"
  | "node_not_ready"
  | "node_draining"
  | "agent_pod_missing"
  | "agent_pod_not_ready"
  | "agent_pod_terminating";

export interface NodeState {
  /** spec.unschedulable (`kubectl cordon`, and the first step of `kubectl drain`). */
  readonly cordoned: boolean;
  /** The Ready condition is True (False and Unknown are both not ready). */
  readonly ready: boolean;
  /** The first configured drain taint the node carries, when it carries one. */
  readonly drainTaint?: string;
}

export function nodeState(node: V1Node, drainTaints: readonly string[]): NodeState {
  const ready = node.status?.conditions?.find((c) => c.type === "Ready")?.status === "True";
  const taint = node.spec?.taints?.find((t) => drainTaints.includes(t.key));
  return { cordoned: node.spec?.unschedulable === true, ready, ...(taint ? { drainTaint: taint.key } : {}) };
}

export interface AgentPod {
  readonly name: string;
  readonly nodeName: string;
  /** host:port of the agent's Connect endpoint, from the pod's IP and its container port. */
  readonly addr?: string;
  /** Addresses by which a heartbeat's `addr` can name this pod (pod IP and host IP). */
  readonly ips: readonly string[];
  readonly running: boolean;
  readonly terminating: boolean;
  /**
   * The pod is being disrupted, not replaced: condition DisruptionTarget=True, which Kubernetes (1.26+) sets on an
   * eviction (Eviction API, taint manager, kubelet node-pressure or graceful node shutdown, preemption) but not
   * on a plain delete such as a DaemonSet rolling update. Its reason, when present.
   */
  readonly disrupted?: string;
}

function portOf(pod: V1Pod, port: string | number): number | undefined {
  if (typeof port === "number") return port;
  for (const container of pod.spec?.containers ?? []) {
    const found = container.ports?.find((p) => p.name === port);
    if (found) return found.containerPort;
  }
  return undefined;
}

function formatAddr(ip: string, port: number): string {
  return ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`;
}

export function agentPod(pod: V1Pod, port: string | number): AgentPod {
  const status = pod.status;
  const conditions = status?.conditions ?? [];
  const ready = conditions.find((c) => c.type === "Ready")?.status === "True";
  const disruption = conditions.find((c) => c.type === "DisruptionTarget" && c.status === "True");
  const podIP = status?.podIP;
  const containerPort = portOf(pod, port);
  return {
    name: pod.metadata?.name ?? "",
    nodeName: pod.spec?.nodeName ?? "",
    ...(podIP && containerPort ? { addr: formatAddr(podIP, containerPort) } : {}),
    ips: [podIP, status?.hostIP, ...(status?.podIPs ?? []).map((p) => p.ip)].filter((ip): ip is string => !!ip),
    running: status?.phase === "Running" && ready,
    terminating: !!pod.metadata?.deletionTimestamp,
    ...(disruption ? { disrupted: disruption.reason || "DisruptionTarget" } : {}),
  };
}

/** The host part of a `host:port` address (IPv6 in brackets or not). */
export function addrHost(addr: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(addr);
  if (bracketed) return bracketed[1] as string;
  const colon = addr.lastIndexOf(":");
  return colon > 0 && addr.indexOf(":") === colon ? addr.slice(0, colon) : addr;
}

/** What the master does with a node agent, from its pod and its Node. */
export interface AgentVerdict {
  /** Where to reach the agent (the pod's address), when its pod is known. */
  readonly addr?: string;
  readonly pod?: string;
  readonly node?: string;
  /** Undefined: new sandboxes may go there. */
  readonly unplaceable?: Unplaceable;
  /** Set when the node's sandboxes should be paused: why. */
  readonly drain?: string;
}

/**
 * The verdict for one node agent. `pods` are the agent pods that match it (normally one; two during a rolling
 * update). A cordoned or NotReady node takes no new sandboxes; a drain taint or a disrupted agent pod also means
 * "pause what runs there". A pod merely terminating (rolling update) takes no new sandboxes but is not a drain:
 * sandboxes outlive an agent restart.
 */
export function agentVerdict(
  pods: readonly AgentPod[],
  nodes: ReadonlyMap<string, NodeState>,
  fallbackNode?: string,
): AgentVerdict {
  const live = pods.find((p) => !p.terminating && p.running) ?? pods.find((p) => !p.terminating) ?? pods[0];
  const nodeName = live?.nodeName || fallbackNode;
  const node = nodeName ? nodes.get(nodeName) : undefined;
  const where = { ...(live?.addr ? { addr: live.addr } : {}), ...(live ? { pod: live.name } : {}) };
  const onNode = nodeName ? { node: nodeName } : {};
  // A replacement pod that is not itself disrupted means the agent stays (e.g. a DaemonSet recreating it).
  const disrupted = pods.every((p) => p.disrupted || p.terminating)
    ? pods.find((p) => p.disrupted)?.disrupted
    : undefined;
  const drain = node?.drainTaint ? `taint ${node.drainTaint}` : disrupted ? `agent pod ${disrupted}` : undefined;
  const verdict = (unplaceable: Unplaceable | undefined): AgentVerdict => ({
    ...where,
    ...onNode,
    ...(unplaceable ? { unplaceable } : {}),
    ...(drain ? { drain } : {}),
  });
  if (drain) return verdict("node_draining");
  if (!live) return verdict("agent_pod_missing");
  if (!node) return verdict("node_unknown");
  if (node.cordoned) return verdict("node_cordoned");
  if (!node.ready) return verdict("node_not_ready");
  if (live.terminating) return verdict("agent_pod_terminating");
  if (!live.running) return verdict("agent_pod_not_ready");
  return verdict(undefined);
}
