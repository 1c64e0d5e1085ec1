import type { ApiSchema } from "@warren/proto/openapi";
import type { SandboxEvent } from "../store/events.js";
import { publicState, type SandboxRow } from "../store/sandboxes.js";

/** Deprecated by E2B but required in the schema; infra answers this constant. */
const CLIENT_ID = "6532622b";

/** The answers below are the document's schemas (proto/openapi/warren.yaml): a field the contract lacks fails tsc. */
export type ListedSandboxView = ApiSchema<"ListedSandbox">;
export type SandboxDetailView = ApiSchema<"SandboxDetail">;
export type SandboxView = ApiSchema<"Sandbox">;
export type SandboxEventView = ApiSchema<"SandboxEvent">;
/** E2B `SandboxLogEntry`. */
export type LogEntry = ApiSchema<"SandboxLogEntry">;

function network(row: SandboxRow): SandboxDetailView["network"] {
  if (!row.network) return undefined;
  const copy: Record<string, unknown> = { ...row.network };
  const proxy = copy.egressProxy;
  if (proxy && typeof proxy === "object") {
    const { password: _password, ...rest } = proxy as Record<string, unknown>;
    copy.egressProxy = rest;
  }
  return copy;
}

/** E2B `ListedSandbox`, plus Warren's `nodeID`. */
export function listedSandbox(row: SandboxRow): ListedSandboxView {
  return {
    sandboxID: row.id,
    templateID: row.sourceTemplateId ?? row.templateId,
    ...(row.alias ? { alias: row.alias } : {}),
    clientID: CLIENT_ID,
    startedAt: row.startedAt.toISOString(),
    endAt: (row.pausedAt ?? row.endAt).toISOString(),
    state: publicState(row.state) ?? "running",
    cpuCount: row.cpuCount,
    memoryMB: row.memoryMB,
    diskSizeMB: row.diskSizeMB,
    envdVersion: row.envdVersion,
    metadata: row.metadata,
    // Warren extra (SDKs ignore fields they do not know): the node it is placed on, null until placed.
    nodeID: row.nodeId,
    // E2B echoes `{name, path}`; the volume id the nodes bind stays inside.
    volumeMounts: row.volumeMounts.map((m) => {
      const { name, path } = (m ?? {}) as { name: string; path: string };
      return { name, path };
    }),
  };
}

/** E2B `SandboxDetail` (the envd access token is not repeated here; connect returns it). */
export function sandboxDetail(row: SandboxRow): SandboxDetailView {
  const net = network(row);
  return {
    ...listedSandbox(row),
    ...(row.allowInternetAccess !== null ? { allowInternetAccess: row.allowInternetAccess } : {}),
    ...(net ? { network: net } : {}),
    // Warren extra: the policy the node enforces (the request folded with the team's egress mode).
    ...(row.egress ? { egress: row.egress } : {}),
    lifecycle: { onTimeout: row.autoPause ? "pause" : "kill", autoResume: row.autoResume },
    // Warren extra: a paused sandbox whose pause is in the cluster's store survives the loss of its node.
    ...(row.state === "paused" ? { durable: row.durableSnapshotId !== null } : {}),
    // Warren extra: the MCP servers the create named (E2B keeps them only for its analytics).
    ...(row.mcpServers.length > 0 ? { mcpServers: row.mcpServers } : {}),
  };
}

/** E2B `Sandbox` (create/connect response) from the master's answer. */
export function sandboxResponse(s: {
  sandboxId: string;
  templateId: string;
  alias: string;
  envdVersion: string;
  envdAccessToken: string;
  trafficAccessToken: string;
  domain: string;
}): SandboxView {
  return {
    sandboxID: s.sandboxId,
    templateID: s.templateId,
    ...(s.alias ? { alias: s.alias } : {}),
    clientID: CLIENT_ID,
    envdVersion: s.envdVersion,
    envdAccessToken: s.envdAccessToken,
    trafficAccessToken: s.trafficAccessToken || null,
    domain: s.domain || null,
  };
}

/** A ledger event as Warren's API shows it. */
export function eventView(event: SandboxEvent): SandboxEventView {
  return {
    id: event.id,
    sandboxID: event.sandboxId,
    type: event.type,
    fromState: event.fromState,
    toState: event.toState,
    data: event.data,
    timestamp: event.createdAt.toISOString(),
  };
}

/** A line of the sandbox's own log (envd), as the master relays it from the node. */
export function envdLogEntry(line: {
  timestampMs: bigint;
  level: string;
  message: string;
  fields: { [key: string]: string };
}): LogEntry {
  return {
    timestamp: new Date(Number(line.timestampMs)).toISOString(),
    // The node agent maps every envd line to these four levels (node-agent/sandbox-log.ts), as the document lists.
    level: line.level as LogEntry["level"],
    message: line.message,
    fields: { source: "envd", ...line.fields },
  };
}

/** A ledger event as an E2B `SandboxLogEntry` (lifecycle logs). */
export function logEntry(event: SandboxEvent): LogEntry {
  const fields: Record<string, string> = { source: "lifecycle", type: event.type };
  if (event.fromState) fields.fromState = event.fromState;
  if (event.toState) fields.toState = event.toState;
  const level =
    event.type.endsWith("failed") || event.type === "sandbox.lost"
      ? "error"
      : event.type === "sandbox.oom"
        ? "warn"
        : "info";
  // An OOM kill says what happened in words a reader of the logs recognises.
  const oom =
    event.type === "sandbox.oom"
      ? (event.data as {
          kills?: number;
          memoryLimitMB?: number;
          victims?: { process: string; memoryMB: number }[];
        })
      : undefined;
  const victims = oom?.victims?.length
    ? `: ${oom.victims.map((v) => `${v.process} (${v.memoryMB} MB)`).join(", ")}`
    : "";
  return {
    timestamp: event.createdAt.toISOString(),
    level,
    message: oom
      ? `sandbox.oom: ${oom.kills ?? 1} process(es) killed at the memory limit (${oom.memoryLimitMB ?? "?"} MB)${victims}`
      : event.toState
        ? `${event.type}: ${event.fromState ?? "-"} -> ${event.toState}`
        : event.type,
    fields,
  };
}
