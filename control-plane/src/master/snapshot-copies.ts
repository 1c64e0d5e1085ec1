import type { NodeHeartbeat } from "@warren/proto/redis";
import type { Db } from "../store/db.js";
import { recordSnapshotCopy, type SnapshotRow, snapshotHolders } from "../store/snapshots.js";
import type { NodeAgentConnector } from "./node-agent-client.js";

/**
 * Makes sure `node` holds `snapshot` before a sandbox starts from it there: a published snapshot (a built
 * template) is pulled from the cluster's store, its digest checked by the node, and the copy recorded (placement
 * prefers nodes holding it; the node sweep deletes the copy once the snapshot is deleted).
 */
export async function ensureSnapshotOn(
  deps: { readonly db: Db; readonly nodeAgent: NodeAgentConnector },
  snapshot: SnapshotRow,
  node: NodeHeartbeat,
  knownHolders?: Set<string>,
): Promise<void> {
  const holders = knownHolders ?? (await snapshotHolders(deps.db, snapshot));
  if (holders.has(node.nodeId)) return;
  if (!snapshot.digest) {
    throw new Error(`snapshot '${snapshot.id}' is only on node ${snapshot.nodeId} (never published to the store)`);
  }
  await deps.nodeAgent(node.nodeId, node.addr).pullSnapshot(snapshot.id, snapshot.digest);
  await recordSnapshotCopy(deps.db, snapshot.id, node.nodeId);
  holders.add(node.nodeId);
}

/** Nodes already holding the snapshot first, each group in the given order. */
export function holdersFirst(nodes: NodeHeartbeat[], holders: ReadonlySet<string> | undefined): NodeHeartbeat[] {
  if (!holders) return nodes;
  return [...nodes.filter((n) => holders.has(n.nodeId)), ...nodes.filter((n) => !holders.has(n.nodeId))];
}
