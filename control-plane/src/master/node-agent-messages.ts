import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  type CreateRequestSchema,
  type CreateResponse,
  type ImportImageResponse,
  type ListResponse,
  type LogsResponse,
  type RunCommandResponse,
  SandboxState,
  type SnapshotInfo,
  type StatsResponse,
} from "@warren/proto/nodeagent/v1/node_agent_pb";
import {
  type CommandEventOnNode,
  type CreateOnNodeRequest,
  type ImportedImage,
  NodeAgentError,
  type SandboxLogLine,
  type SandboxOnNode,
  type SandboxPlacement,
  type SandboxStats,
  type SnapshotOnNode,
} from "./node-agent-client.js";

/**
 * The master's one seam between `warren.nodeagent.v1` messages and the `NodeAgentClient` types: where the wire's
 * shapes are not what the master computes with (64-bit integers as bigint → number, Unix milliseconds → Date,
 * enums → state names, oneofs → tagged events, absent messages → errors, proto3 defaults ↔ absent fields). Pure,
 * so the mapping is tested without a node agent (`node-agent-messages.test.ts`).
 */

/** The Create request for a node; fields the master leaves out take the proto3 defaults the agent reads as absent. */
export function createRequestMessage(request: CreateOnNodeRequest): MessageInitShape<typeof CreateRequestSchema> {
  return {
    sandboxId: request.sandboxId,
    teamId: request.teamId,
    templateId: request.templateId,
    resources: {
      cpuCount: request.resources.cpuCount,
      memoryMb: request.resources.memoryMB,
      diskSizeMb: request.resources.diskSizeMB,
    },
    envVars: { ...request.envVars },
    envdAccessToken: request.envdAccessToken,
    trafficTokenHash: request.trafficTokenHash,
    publicTraffic: request.publicTraffic,
    autoResume: request.autoResume,
    metadata: { ...request.metadata },
    egress: { allowOut: [...request.egress.allowOut], denyOut: [...request.egress.denyOut] },
    snapshotId: request.snapshotId ?? "",
    snapshotEnvdAccessToken: request.snapshotEnvdAccessToken ?? "",
    maskRequestHost: request.maskRequestHost ?? "",
    warmPool: request.warmPool === true,
    defaultUser: request.defaultUser ?? "",
    defaultWorkdir: request.defaultWorkdir ?? "",
    volumeMounts: (request.volumeMounts ?? []).map((m) => ({ volumeId: m.volumeId, path: m.path })),
  };
}

/** Where a Create or Resume put the sandbox; a node that answers without one failed. */
export function placementOf(response: CreateResponse | undefined): SandboxPlacement {
  if (!response) throw new NodeAgentError("failed", "node agent answered without a placement");
  return {
    exec: response.exec,
    sandboxAddr: response.sandboxAddr,
    envdUrl: response.envdUrl,
    ...(response.envdVersion ? { envdVersion: response.envdVersion } : {}),
  };
}

export function sandboxesOnNode(response: ListResponse): SandboxOnNode[] {
  return response.sandboxes.map((sandbox) => ({
    sandboxId: sandbox.sandboxId,
    exec: sandbox.exec,
    state: sandbox.state === SandboxState.PAUSED ? ("paused" as const) : ("running" as const),
  }));
}

export function statsOf(response: StatsResponse): SandboxStats {
  return {
    memoryUsageBytes: Number(response.memoryUsageBytes),
    memoryLimitBytes: Number(response.memoryLimitBytes),
    cpuUsageUsec: Number(response.cpuUsageUsec),
    diskUsageBytes: Number(response.diskUsageBytes),
    diskLimitBytes: Number(response.diskLimitBytes),
    oomKills: response.oomKills,
    oomVictims: response.oomVictims.map((v) => ({
      process: v.process,
      memoryBytes: Number(v.memoryBytes),
      at: v.at,
    })),
    leaseEvents: response.leaseEvents.map((e) => ({
      seq: Number(e.seq),
      type: e.type,
      pid: e.pid,
      tag: e.tag,
      ttlMs: Number(e.ttlMs),
      signal: e.signal,
      at: e.at,
    })),
  };
}

export function logLinesOf(response: LogsResponse): SandboxLogLine[] {
  return response.lines.map((line) => ({
    timestampMs: Number(line.timestampMs),
    level: line.level,
    message: line.message,
    fields: { ...line.fields },
  }));
}

/** A snapshot the node made; a node that answers without one failed. */
export function snapshotOnNode(info: SnapshotInfo | undefined): SnapshotOnNode {
  if (!info) throw new NodeAgentError("failed", "node agent answered without a snapshot");
  return {
    snapshotId: info.snapshotId,
    templateId: info.templateId,
    driver: info.driver,
    memory: info.memory,
    sizeBytes: Number(info.sizeBytes),
    createdAt: new Date(Number(info.createdAt)),
  };
}

export function importedImageOf(response: ImportImageResponse): ImportedImage {
  return {
    snapshot: snapshotOnNode(response.snapshot),
    resolved: response.resolved,
    digest: response.digest,
    env: [...response.env],
    user: response.user,
    workdir: response.workdir,
    log: [...response.log],
  };
}

/** One RunCommand stream message as an event; undefined for a message without one (a newer agent's kind). */
export function commandEventOf(message: RunCommandResponse): CommandEventOnNode | undefined {
  const event = message.event;
  switch (event.case) {
    case "pid":
      return { kind: "pid", pid: event.value };
    case "stdout":
    case "stderr":
      return { kind: event.case, data: event.value };
    case "exit":
      return { kind: "exit", exitCode: event.value.exitCode, status: event.value.status };
    default:
      return undefined;
  }
}
