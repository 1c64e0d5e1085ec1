import { create } from "@bufbuild/protobuf";
import { type ConnectRouter, createClient, type ServiceImpl } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  CreateResponseSchema,
  NodeAgentService,
  ResourcesSchema,
  SandboxInfoSchema,
  SandboxState,
  type SnapshotInfo,
  SnapshotInfoSchema,
} from "@warren/proto/nodeagent/v1/node_agent_pb";
import type { SnapshotImage } from "../runtime/driver.js";
import type { NodeAgent } from "./agent.js";
import { AgentError, toConnectError } from "./errors.js";
import type { Logger } from "./log.js";

/**
 * `warren.nodeagent.v1.NodeAgentService`: thin handlers that parse the request into the agent's types, call the
 * agent, and map AgentError codes to Connect codes (errors.ts, one place).
 */
export function nodeAgentService(agent: NodeAgent, log: Logger): ServiceImpl<typeof NodeAgentService> {
  const guard = async <T>(method: string, fields: Record<string, unknown>, run: () => Promise<T>): Promise<T> => {
    try {
      // Before the agent has re-adopted its sandboxes (restart), "not here" would be a lie the master acts on.
      if (!agent.ready && method !== "Info")
        throw new AgentError("unavailable", "node agent is starting (re-adopting its sandboxes)");
      return await run();
    } catch (error) {
      const connectError = toConnectError(error);
      log.warn("request failed", { method, ...fields, code: connectError.code, error: connectError.rawMessage });
      throw connectError;
    }
  };
  return {
    create: (req, context) =>
      guard("Create", { sandboxId: req.sandboxId, templateId: req.templateId }, async () => {
        const placement = await agent.create(
          {
            sandboxId: req.sandboxId,
            teamId: req.teamId,
            templateId: req.templateId,
            resources: {
              cpuCount: req.resources?.cpuCount ?? 0,
              memoryMiB: req.resources?.memoryMb ?? 0,
              diskMiB: req.resources?.diskSizeMb ?? 0,
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
            ...(req.egress ? { egress: { allowOut: req.egress.allowOut, denyOut: req.egress.denyOut } } : {}),
            ...(req.snapshotId ? { snapshotId: req.snapshotId } : {}),
            ...(req.snapshotEnvdAccessToken ? { snapshotEnvdAccessToken: req.snapshotEnvdAccessToken } : {}),
            ...(req.volumeMounts.length > 0
              ? { volumeMounts: req.volumeMounts.map((m) => ({ volumeId: m.volumeId, path: m.path })) }
              : {}),
          },
          // The master's deadline passed (or it went away): a create still waiting for a start slot leaves.
          context.signal,
        );
        return create(CreateResponseSchema, {
          sandboxId: placement.sandboxId,
          exec: placement.exec,
          sandboxAddr: placement.sandboxAddr,
          envdUrl: placement.envdUrl,
          envdVersion: placement.envdVersion,
          pooled: placement.pooled,
          generation: BigInt(placement.generation),
        });
      }),
    kill: (req) =>
      guard("Kill", { sandboxId: req.sandboxId }, async () => {
        await agent.kill(req.sandboxId, req.exec || undefined);
        return {};
      }),
    list: () =>
      guard("List", {}, async () => ({
        sandboxes: agent.list().map((s) =>
          create(SandboxInfoSchema, {
            sandboxId: s.sandboxId,
            exec: s.exec,
            state: s.paused ? SandboxState.PAUSED : SandboxState.RUNNING,
            templateId: s.templateId,
            teamId: s.teamId,
            sandboxAddr: s.sandboxAddr,
            resources: create(ResourcesSchema, {
              cpuCount: s.resources.cpuCount,
              memoryMb: s.resources.memoryMiB,
              diskSizeMb: s.resources.diskMiB,
            }),
            startedAt: BigInt(s.startedAt),
            metadata: { ...s.metadata },
          }),
        ),
      })),
    stats: (req) =>
      guard("Stats", { sandboxId: req.sandboxId }, async () => {
        const stats = await agent.stats(req.sandboxId);
        const leaseEvents = req.envdAccessToken
          ? await agent.leaseEvents(req.sandboxId, req.envdAccessToken, Number(req.leaseEventsAfter))
          : [];
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
          sandboxId: req.sandboxId,
          memoryUsageBytes: BigInt(stats.memoryUsageBytes),
          memoryLimitBytes: BigInt(Math.min(stats.memoryLimitBytes, Number.MAX_SAFE_INTEGER)),
          cpuUsageUsec: BigInt(stats.cpuUsageUsec),
          pids: stats.pids,
          pidsLimit: Math.min(stats.pidsLimit, 2 ** 32 - 1),
          diskUsageBytes: BigInt(stats.diskUsageBytes),
          diskLimitBytes: BigInt(stats.diskLimitBytes),
          oomKills: stats.oomKills ?? 0,
        };
      }),
    pause: (req) =>
      guard("Pause", { sandboxId: req.sandboxId }, async () => {
        await agent.pause(req.sandboxId, req.memory);
        return {};
      }),
    resume: (req) =>
      guard("Resume", { sandboxId: req.sandboxId }, async () => {
        const placement = await agent.resume({
          sandboxId: req.sandboxId,
          memory: req.memory,
          envVars: req.envVars,
          envdAccessToken: req.envdAccessToken,
        });
        return {
          placement: create(CreateResponseSchema, {
            sandboxId: placement.sandboxId,
            exec: placement.exec,
            sandboxAddr: placement.sandboxAddr,
            envdUrl: placement.envdUrl,
            envdVersion: placement.envdVersion,
            pooled: placement.pooled,
            generation: BigInt(placement.generation),
          }),
        };
      }),
    updateEgress: (req) =>
      guard("UpdateEgress", { sandboxId: req.sandboxId }, async () => {
        await agent.updateEgress(req.sandboxId, {
          allowOut: req.egress?.allowOut ?? [],
          denyOut: req.egress?.denyOut ?? ["0.0.0.0/0"],
        });
        return {};
      }),
    logs: (req) =>
      guard("Logs", { sandboxId: req.sandboxId }, async () => ({
        lines: (await agent.logs(req.sandboxId, Math.min(req.limit || 1000, 10_000))).map((line) => ({
          timestampMs: BigInt(line.timestampMs),
          level: line.level,
          message: line.message,
          fields: { ...line.fields },
        })),
      })),
    snapshot: (req) =>
      guard("Snapshot", { sandboxId: req.sandboxId, snapshotId: req.snapshotId }, async () => ({
        snapshot: snapshotInfo(await agent.snapshot(req.sandboxId, req.snapshotId, req.filesOnly)),
      })),
    async *runCommand(req, context) {
      // The command and its output are the user's (build steps): never logged here.
      const events = await guard("RunCommand", { sandboxId: req.sandboxId }, async () =>
        agent.runCommand(
          req.sandboxId,
          req.envdAccessToken,
          { command: req.command, user: req.user, cwd: req.cwd, env: { ...req.env }, timeoutMs: req.timeoutMs },
          context.signal,
        ),
      );
      try {
        for await (const event of events) {
          if (event.kind === "pid") yield { event: { case: "pid", value: event.pid } };
          else if (event.kind === "exit") {
            yield { event: { case: "exit", value: { exitCode: event.exitCode, status: event.status } } };
          } else yield { event: { case: event.kind, value: event.data } };
        }
      } catch (error) {
        throw toConnectError(error);
      }
    },
    publishSnapshot: (req) =>
      guard("PublishSnapshot", { snapshotId: req.snapshotId }, async () => {
        const published = await agent.publishSnapshot(req.snapshotId, { ...req.labels });
        return { digest: published.digest, sizeBytes: BigInt(published.sizeBytes) };
      }),
    pullSnapshot: (req) =>
      guard("PullSnapshot", { snapshotId: req.snapshotId, digest: req.digest }, async () => ({
        snapshot: snapshotInfo(await agent.pullSnapshot(req.snapshotId, req.digest)),
      })),
    listPublishedSnapshots: () =>
      guard("ListPublishedSnapshots", {}, async () => ({ snapshotIds: await agent.listPublishedSnapshots() })),
    unpublishSnapshot: (req) =>
      guard("UnpublishSnapshot", { snapshotId: req.snapshotId }, async () => {
        await agent.unpublishSnapshot(req.snapshotId);
        return {};
      }),
    importImage: (req) =>
      guard("ImportImage", { snapshotId: req.snapshotId, image: req.image }, async () => {
        const credentials = req.username ? { username: req.username, password: req.password } : undefined;
        const { snapshot, pulled, log } = await agent.importImage(req.snapshotId, req.image, credentials);
        return {
          snapshot: snapshotInfo(snapshot),
          resolved: pulled.ref,
          digest: pulled.digest,
          env: [...pulled.config.env],
          user: pulled.config.user,
          workdir: pulled.config.workdir,
          log,
        };
      }),
    writeFile: (req) =>
      guard("WriteFile", { sandboxId: req.sandboxId, path: req.path, bytes: req.data.byteLength }, async () => {
        await agent.writeFile(req.sandboxId, req.envdAccessToken, req.path, req.data);
        return {};
      }),
    deleteSnapshot: (req) =>
      guard("DeleteSnapshot", { snapshotId: req.snapshotId }, async () => {
        await agent.deleteSnapshot(req.snapshotId);
        return {};
      }),
    listSnapshots: () =>
      guard("ListSnapshots", {}, async () => ({
        snapshots: (await agent.listSnapshots()).map(snapshotInfo),
      })),
    async *exportSnapshot(req) {
      const data = await guard("ExportSnapshot", { snapshotId: req.snapshotId }, () =>
        agent.exportSnapshot(req.snapshotId),
      );
      try {
        for await (const chunk of data) yield { data: chunk };
      } catch (error) {
        throw toConnectError(error);
      }
    },
    importSnapshot: (req) =>
      guard("ImportSnapshot", { snapshotId: req.snapshotId, sourceAddr: req.sourceAddr }, async () => {
        if (!/^[A-Za-z0-9.\-[\]:]+:\d+$/.test(req.sourceAddr)) {
          throw new AgentError("invalid_argument", `source_addr must be host:port, got '${req.sourceAddr}'`);
        }
        const source = createClient(
          NodeAgentService,
          createConnectTransport({ baseUrl: `http://${req.sourceAddr}`, httpVersion: "1.1" }),
        );
        const chunks = async function* () {
          for await (const chunk of source.exportSnapshot({ snapshotId: req.snapshotId })) yield chunk.data;
        };
        return { snapshot: snapshotInfo(await agent.importSnapshot(req.snapshotId, chunks())) };
      }),
    info: () =>
      guard("Info", {}, async () => {
        const info = agent.info();
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
      }),
  };
}

function snapshotInfo(image: SnapshotImage): SnapshotInfo {
  return create(SnapshotInfoSchema, {
    snapshotId: image.snapshotId,
    templateId: image.templateId,
    memory: image.memory,
    sizeBytes: BigInt(image.sizeBytes),
    resources: create(ResourcesSchema, {
      cpuCount: image.resources.cpuCount,
      memoryMb: image.resources.memoryMiB,
      diskSizeMb: image.resources.diskMiB,
    }),
    createdAt: BigInt(image.createdAt),
    driver: image.driver,
  });
}

export function nodeAgentRoutes(agent: NodeAgent, log: Logger): (router: ConnectRouter) => void {
  return (router) => {
    router.service(NodeAgentService, nodeAgentService(agent, log));
  };
}
