import { crashKey, heartbeatFromHash, NODES_SET_KEY, type NodeHeartbeat, nodeKey } from "@warren/proto/redis";
import type { Redis } from "ioredis";

export interface NodeView {
  readonly nodeId: string;
  /** Undefined when the node is in warren:nodes but its heartbeat key expired. */
  readonly heartbeat?: NodeHeartbeat;
}

/** What a cluster manager says about one node agent (see kubernetes/node-state.ts). */
export interface NodeVerdict {
  /** Where to reach the agent, when the cluster knows better than the heartbeat (the agent pod's address). */
  readonly addr?: string;
  /** Why the node takes no new sandboxes; undefined when it may. */
  readonly unplaceable?: string;
  /** Why the node's sandboxes should be paused (it is being drained); undefined otherwise. */
  readonly drain?: string;
}

/** A source of node verdicts beside the heartbeats: Kubernetes (`kubernetes/cluster-view.ts`), or none. */
export interface NodeDirectory {
  verdict(heartbeat: NodeHeartbeat): NodeVerdict;
}

/**
 * Reads node liveness and capacity from the heartbeats node agents keep in Redis. With a `directory`
 * (Kubernetes), the agent's address comes from its pod and placement skips nodes the directory rules out;
 * without one, every heartbeating node takes sandboxes at the address it advertises.
 */
export class NodeRegistry {
  constructor(
    private readonly redis: Redis,
    private readonly directory?: NodeDirectory,
    /** Nodes an operator cordoned (admin API, PostgreSQL). */
    private readonly cordoned?: () => Promise<ReadonlySet<string>>,
  ) {}

  async nodes(): Promise<NodeView[]> {
    const ids = (await this.redis.smembers(NODES_SET_KEY)).sort();
    if (ids.length === 0) return [];
    const pipeline = this.redis.pipeline();
    for (const id of ids) pipeline.hgetall(nodeKey(id));
    const results = (await pipeline.exec()) ?? [];
    return ids.map((nodeId, i) => {
      const hash = (results[i]?.[1] ?? {}) as Record<string, string>;
      const heartbeat = heartbeatFromHash(nodeId, hash);
      return heartbeat ? { nodeId, heartbeat } : { nodeId };
    });
  }

  /** Every heartbeating node, whatever the directory says (kills, pauses, resumes and reconciling need them all). */
  /** Why a node agent found this sandbox dead and removed it (its watchdog), if it did in the last minutes. */
  async crashReason(sandboxId: string): Promise<string | undefined> {
    return (await this.redis.get(crashKey(sandboxId))) ?? undefined;
  }

  async liveNodes(): Promise<NodeHeartbeat[]> {
    const live = (await this.nodes()).flatMap((node) => (node.heartbeat ? [node.heartbeat] : []));
    const directory = this.directory;
    if (!directory) return live;
    return live.map((heartbeat) => {
      const addr = directory.verdict(heartbeat).addr;
      return addr && addr !== heartbeat.addr ? { ...heartbeat, addr } : heartbeat;
    });
  }

  /** Live nodes that may take new sandboxes: not cordoned (by an operator or Kubernetes), NotReady or draining. */
  async placeableNodes(): Promise<NodeHeartbeat[]> {
    const directory = this.directory;
    const [live, cordoned] = await Promise.all([this.liveNodes(), this.cordoned?.() ?? new Set<string>()]);
    return live.filter((heartbeat) => !cordoned.has(heartbeat.nodeId) && !directory?.verdict(heartbeat).unplaceable);
  }

  /** Live nodes being drained, with the reason (none without a directory). */
  async drainingNodes(): Promise<{ node: NodeHeartbeat; reason: string }[]> {
    const directory = this.directory;
    if (!directory) return [];
    return (await this.liveNodes()).flatMap((node) => {
      const reason = directory.verdict(node).drain;
      return reason ? [{ node, reason }] : [];
    });
  }
}
