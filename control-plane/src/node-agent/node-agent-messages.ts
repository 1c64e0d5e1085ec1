import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  type CreateRequest,
  type CreateResponse,
  CreateResponseSchema,
  type EgressPolicy as EgressPolicyMessage,
  type InfoResponseSchema,
  type LogLineSchema,
  type ResourcesSchema,
  type ResumeRequest,
  type RunCommandResponseSchema,
  type SandboxInfo,
  SandboxInfoSchema,
  SandboxState,
  type SnapshotInfo,
  SnapshotInfoSchema,
  type StatsResponseSchema,
} from "@warren/proto/nodeagent/v1/node_agent_pb";
import type { InstanceStats, SandboxResources, SnapshotImage } from "../runtime/driver.js";
import type { EgressPolicy } from "../runtime/egress/policy.js";
import type { CommandEvent } from "./sandbox-exec.js";
import type { SandboxLogLine } from "./sandbox-log.js";
import type {
  CreateSandboxInput,
  LeaseJournalEntry,
  NodeInfo,
  ResumeSandboxInput,
  SandboxPlacement,
  SandboxSummary,
} from "./sandbox-model.js";

/**
 * The node agent's one seam between `warren.nodeagent.v1` messages and the agent's own types (sandbox-model.ts):
 * resource names (MiB), numbers ↔ 64-bit bigint, the proto3 defaults of a request ↔ absent fields. The service
 * (service.ts) only calls the agent with what comes out of here. Pure, so it is tested without a sandbox
 * (`node-agent-messages.test.ts`).
 */

function resourcesMessage(resources: SandboxResources): MessageInitShape<typeof ResourcesSchema> {
  return { cpuCount: resources.cpuCount, memoryMb: resources.memoryMB, diskSizeMb: resources.diskSizeMB };
}

/** A Create as the agent takes it: 0 resources are the template's, empty ids and tokens are absent. */
export function createInputOf(req: CreateRequest): CreateSandboxInput {
  return {
    sandboxId: req.sandboxId,
    teamId: req.teamId,
    templateId: req.templateId,
    resources: {
      cpuCount: req.resources?.cpuCount ?? 0,
      memoryMB: req.resources?.memoryMb ?? 0,
      diskSizeMB: req.resources?.diskSizeMb ?? 0,
    },
    envVars: req.envVars,
    envdAccessToken: req.envdAccessToken,
    trafficTokenHash: req.trafficTokenHash,
    publicTraffic: req.publicTraffic,
    autoResume: req.autoResume,
    metadata: req.metadata,
    defaultUser: req.defaultUser,
    defaultWorkdir: req.defaultWorkdir,
    maskRequestHost: req.maskRequestHost,
    warmPool: req.warmPool,
    // Unset: nothing leaves the sandbox (the agent's default).
    ...(req.egress ? { egress: { allowOut: req.egress.allowOut, denyOut: req.egress.denyOut } } : {}),
    ...(req.snapshotId ? { snapshotId: req.snapshotId } : {}),
    ...(req.snapshotEnvdAccessToken ? { snapshotEnvdAccessToken: req.snapshotEnvdAccessToken } : {}),
    ...(req.volumeMounts.length > 0
      ? { volumeMounts: req.volumeMounts.map((m) => ({ volumeId: m.volumeId, path: m.path })) }
      : {}),
  };
}

export function resumeInputOf(req: ResumeRequest): ResumeSandboxInput {
  return {
    sandboxId: req.sandboxId,
    memory: req.memory,
    envVars: req.envVars,
    envdAccessToken: req.envdAccessToken,
  };
}

/** An UpdateEgress policy; unset is the closed policy (nothing leaves), as at create. */
export function egressOf(message: EgressPolicyMessage | undefined): EgressPolicy {
  return { allowOut: message?.allowOut ?? [], denyOut: message?.denyOut ?? ["0.0.0.0/0"] };
}

/** Where a create or resume put the sandbox: Create's answer, and Resume's `placement`. */
export function createResponseOf(placement: SandboxPlacement): CreateResponse {
  return create(CreateResponseSchema, {
    sandboxId: placement.sandboxId,
    exec: placement.exec,
    sandboxAddr: placement.sandboxAddr,
    envdUrl: placement.envdUrl,
    envdVersion: placement.envdVersion,
    pooled: placement.pooled,
    generation: BigInt(placement.generation),
  });
}

export function sandboxInfoOf(summary: SandboxSummary): SandboxInfo {
  return create(SandboxInfoSchema, {
    sandboxId: summary.sandboxId,
    exec: summary.exec,
    state: summary.paused ? SandboxState.PAUSED : SandboxState.RUNNING,
    templateId: summary.templateId,
    teamId: summary.teamId,
    sandboxAddr: summary.sandboxAddr,
    resources: resourcesMessage(summary.resources),
    startedAt: BigInt(summary.startedAt),
    metadata: { ...summary.metadata },
  });
}

/** Stats, with the lease journal entries asked for; limits past the wire's range are capped, not wrapped. */
export function statsResponseOf(
  sandboxId: string,
  stats: InstanceStats,
  leaseEvents: readonly LeaseJournalEntry[],
): MessageInitShape<typeof StatsResponseSchema> {
  return {
    leaseEvents: leaseEvents.map((e) => ({
      seq: BigInt(e.seq),
      type: e.type,
      pid: e.pid,
      tag: e.tag ?? "",
      ttlMs: BigInt(e.ttlMs),
      signal: e.signal ?? "",
      at: e.at,
    })),
    sandboxId,
    memoryUsageBytes: BigInt(stats.memoryUsageBytes),
    memoryLimitBytes: BigInt(Math.min(stats.memoryLimitBytes, Number.MAX_SAFE_INTEGER)),
    cpuUsageUsec: BigInt(stats.cpuUsageUsec),
    pids: stats.pids,
    pidsLimit: Math.min(stats.pidsLimit, 2 ** 32 - 1),
    diskUsageBytes: BigInt(stats.diskUsageBytes),
    diskLimitBytes: BigInt(stats.diskLimitBytes),
    oomKills: stats.oomKills ?? 0,
    oomVictims: (stats.oomVictims ?? []).map((v) => ({
      process: v.process,
      memoryBytes: BigInt(v.memoryBytes),
      at: v.at,
    })),
  };
}

export function snapshotInfoOf(image: SnapshotImage): SnapshotInfo {
  return create(SnapshotInfoSchema, {
    snapshotId: image.snapshotId,
    templateId: image.templateId,
    memory: image.memory,
    sizeBytes: BigInt(image.sizeBytes),
    resources: resourcesMessage(image.resources),
    createdAt: BigInt(image.createdAt),
    driver: image.driver,
  });
}

export function logLineMessage(line: SandboxLogLine): MessageInitShape<typeof LogLineSchema> {
  return {
    timestampMs: BigInt(line.timestampMs),
    level: line.level,
    message: line.message,
    fields: { ...line.fields },
  };
}

export function commandEventMessage(event: CommandEvent): MessageInitShape<typeof RunCommandResponseSchema> {
  if (event.kind === "pid") return { event: { case: "pid", value: event.pid } };
  if (event.kind === "exit") {
    return { event: { case: "exit", value: { exitCode: event.exitCode, status: event.status } } };
  }
  return { event: { case: event.kind, value: event.data } };
}

export function infoResponseOf(info: NodeInfo): MessageInitShape<typeof InfoResponseSchema> {
  return {
    nodeId: info.nodeId,
    addr: info.addr,
    driver: info.driver,
    cpuCount: info.cpuCount,
    memoryTotalBytes: BigInt(info.memoryTotalBytes),
    memoryFreeBytes: BigInt(info.memoryFreeBytes),
    sandboxes: info.sandboxes,
    pools: { ...info.pools },
    templates: [...info.templates],
  };
}
