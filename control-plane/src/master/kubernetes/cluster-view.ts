import { type Informer, makeInformer, type ObjectCache, type V1Node, type V1Pod } from "@kubernetes/client-node";
import type { NodeHeartbeat } from "@warren/proto/redis";
import type { KubernetesConfig } from "../config.js";
import type { Logger } from "../log.js";
import type { NodeDirectory } from "../node-registry.js";
import { describeError, type KubernetesApi } from "./api.js";
import {
  type AgentPod,
  type AgentVerdict,
  addrHost,
  agentPod,
  agentVerdict,
  type NodeState,
  nodeState,
} from "./node-state.js";

/** How long a failed list/watch waits before it starts again. */
const RESTART_MS = 1_000;

/**
 * The node agents and their Nodes as the Kubernetes API shows them: the agent pods (namespace + label selector)
 * and every Node, each kept by a list-then-watch informer. A heartbeat is matched to its pod by node name
 * (heartbeat nodeId = pod spec.nodeName) or by address (heartbeat addr host = pod IP or host IP; the chart's
 * agents advertise <host IP>:<port> on the host network).
 */
export class KubernetesNodeView implements NodeDirectory {
  private readonly pods: Informer<V1Pod> & ObjectCache<V1Pod>;
  private readonly nodes: Informer<V1Node> & ObjectCache<V1Node>;
  private stopped = false;
  private readonly restarts = new Set<NodeJS.Timeout>();
  private cache: { pods: AgentPod[]; nodes: Map<string, NodeState> } | undefined;
  /** Verdicts last logged, by node id, so a change is logged once. */
  private readonly logged = new Map<string, string>();

  constructor(
    api: KubernetesApi,
    private readonly config: KubernetesConfig,
    private readonly log: Logger,
  ) {
    const { namespace, agentSelector } = config;
    this.pods = makeInformer(
      api.kubeConfig,
      `/api/v1/namespaces/${namespace}/pods`,
      () => api.core.listNamespacedPod({ namespace, labelSelector: agentSelector }),
      agentSelector,
    );
    this.nodes = makeInformer(api.kubeConfig, "/api/v1/nodes", () => api.core.listNode());
  }

  /** Lists pods and Nodes and starts watching; rejects when the first list fails (RBAC, no API server). */
  async start(): Promise<void> {
    await Promise.all([this.follow(this.pods, "pods"), this.follow(this.nodes, "nodes")]);
  }

  private async follow<T extends V1Pod | V1Node>(informer: Informer<T>, what: string): Promise<void> {
    let firstError: unknown;
    let started = false;
    informer.on("change", () => {
      this.cache = undefined;
    });
    informer.on("error", (error: unknown) => {
      this.cache = undefined;
      if (!started) {
        firstError = error;
        return;
      }
      if (this.stopped) return;
      this.log.warn("kubernetes watch failed; restarting", { resource: what, error: describeError(error) });
      const timer = setTimeout(() => {
        this.restarts.delete(timer);
        if (!this.stopped) void informer.start();
      }, RESTART_MS);
      this.restarts.add(timer);
    });
    await informer.start();
    if (firstError !== undefined) {
      await informer.stop();
      throw new Error(`listing ${what} from the Kubernetes API failed: ${describeError(firstError)}`);
    }
    started = true;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const timer of this.restarts) clearTimeout(timer);
    await Promise.all([this.pods.stop(), this.nodes.stop()]);
  }

  private state(): { pods: AgentPod[]; nodes: Map<string, NodeState> } {
    if (!this.cache) {
      const pods = this.pods.list(this.config.namespace).map((pod) => agentPod(pod, this.config.agentPort));
      const nodes = new Map(
        this.nodes.list().map((node) => [node.metadata?.name ?? "", nodeState(node, this.config.drainTaints)]),
      );
      this.cache = { pods, nodes };
    }
    return this.cache;
  }

  verdict(heartbeat: NodeHeartbeat): AgentVerdict {
    const { pods, nodes } = this.state();
    const host = addrHost(heartbeat.addr);
    const mine = pods.filter((pod) => pod.nodeName === heartbeat.nodeId || pod.ips.includes(host));
    const verdict = agentVerdict(mine, nodes, nodes.has(heartbeat.nodeId) ? heartbeat.nodeId : undefined);
    const summary = `${verdict.unplaceable ?? "placeable"}${verdict.drain ? ` (drain: ${verdict.drain})` : ""}`;
    if (this.logged.get(heartbeat.nodeId) !== summary) {
      this.logged.set(heartbeat.nodeId, summary);
      this.log.info("node state from kubernetes", {
        node: heartbeat.nodeId,
        k8sNode: verdict.node,
        pod: verdict.pod,
        addr: verdict.addr,
        state: summary,
      });
    }
    return verdict;
  }
}
