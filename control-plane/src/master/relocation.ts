import { randomBytes } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import { effectiveEgress } from "../runtime/egress/policy.js";
import type { SandboxRow } from "../store/sandboxes.js";
import type { Logger } from "./log.js";
import type { CreateOnNodeRequest, NodeAgentConnector, SandboxPlacement } from "./node-agent-client.js";
import type { TokenIssuer } from "./tokens.js";

/** What a node agent needs to start `row`'s sandbox (a create, or a paused sandbox moved to another node). */
export function nodeCreateRequest(row: SandboxRow, tokens: TokenIssuer): CreateOnNodeRequest {
  return {
    sandboxId: row.id,
    teamId: row.teamId,
    templateId: row.templateId,
    resources: { cpuCount: row.cpuCount, memoryMB: row.memoryMB, diskSizeMB: row.diskSizeMB },
    envVars: row.envVars,
    envdAccessToken: tokens.envdToken(row.id, row.tokenNonce),
    trafficTokenHash: row.trafficTokenHash ?? "",
    publicTraffic: row.trafficTokenHash === null,
    autoResume: row.autoResume,
    metadata: row.metadata,
    egress: row.egress ?? effectiveEgress(row.network, row.allowInternetAccess, "open"),
    maskRequestHost: typeof row.network?.maskRequestHost === "string" ? row.network.maskRequestHost : "",
    volumeMounts: mountedVolumes(row.volumeMounts),
  };
}

/** The volume mounts a row recorded at create (`{name, path, volumeId}`), as the node binds them. */
function mountedVolumes(stored: readonly unknown[]): { volumeId: string; path: string }[] {
  return stored.flatMap((m) => {
    const { volumeId, path } = (m ?? {}) as { volumeId?: unknown; path?: unknown };
    return typeof volumeId === "string" && typeof path === "string" ? [{ volumeId, path }] : [];
  });
}

/**
 * Moves a paused sandbox from `from` to `to` and starts it there: a snapshot on `from` (its files, and its
 * processes where that node's driver keeps memory in snapshots), copied by `to` straight from `from`
 * (ImportSnapshot), a create from it on `to` with the sandbox's own id and tokens, then the old instance is
 * removed. The snapshot copies go either way. Until the create on `to` succeeds, `from` still holds the paused
 * sandbox untouched, so any failure leaves it paused where it was.
 *
 * `keepMemory`: the resume must continue the sandbox's processes; when the snapshot could not take them, the
 * move is abandoned (the caller resumes it where it is).
 */
export async function relocatePaused(
  deps: { readonly nodeAgent: NodeAgentConnector; readonly tokens: TokenIssuer; readonly log: Logger },
  row: SandboxRow,
  from: NodeHeartbeat,
  to: NodeHeartbeat,
  keepMemory: boolean,
): Promise<SandboxPlacement> {
  const source = deps.nodeAgent(from.nodeId, from.addr);
  const target = deps.nodeAgent(to.nodeId, to.addr);
  const snapshotId = `m${randomBytes(10).toString("hex")}`;
  const startedAt = performance.now();
  const made = await source.snapshot(row.id, snapshotId);
  let placement: SandboxPlacement;
  try {
    if (keepMemory && !made.memory) throw new Error(`node ${from.nodeId} cannot snapshot the sandbox's memory`);
    const moved = await target.importSnapshot(snapshotId, from.addr);
    const token = deps.tokens.envdToken(row.id, row.tokenNonce);
    try {
      placement = await target.create({
        ...nodeCreateRequest(row, deps.tokens),
        snapshotId,
        // A memory snapshot's envd already holds the sandbox's token: /init presents it and keeps it.
        ...(moved.memory ? { snapshotEnvdAccessToken: token } : {}),
      });
    } finally {
      await target.deleteSnapshot(snapshotId).catch(() => undefined);
    }
    deps.log.info("paused sandbox moved to another node", {
      sandboxId: row.id,
      from: from.nodeId,
      to: to.nodeId,
      sizeBytes: moved.sizeBytes,
      // Less than the size when the target had some of its layers (the template's, an earlier move's).
      transferredBytes: moved.transferredBytes,
      memory: moved.memory,
      ms: Math.round(performance.now() - startedAt),
    });
  } finally {
    await source.deleteSnapshot(snapshotId).catch(() => undefined);
  }
  // The old instance; if this fails, the reconciler removes it (its row names the new node).
  await source
    .kill(row.id)
    .catch((error) =>
      deps.log.warn("removing a moved sandbox from its old node failed", { sandboxId: row.id, error: String(error) }),
    );
  return placement;
}
