import { type ConnectRouter, createClient, type ServiceImpl } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { NodeAgentService } from "@warren/proto/nodeagent/v1/node_agent_pb";
import type { NodeAgent } from "./agent.js";
import { AgentError, toConnectError } from "./errors.js";
import type { Logger } from "./log.js";
import {
  commandEventMessage,
  createInputOf,
  createResponseOf,
  egressOf,
  infoResponseOf,
  logLineMessage,
  resumeInputOf,
  sandboxInfoOf,
  snapshotInfoOf,
  statsResponseOf,
} from "./node-agent-messages.js";

/**
 * `warren.nodeagent.v1.NodeAgentService`: thin handlers that turn the request into the agent's types and the
 * answer back (node-agent-messages.ts), call the agent, and map AgentError codes to Connect codes (errors.ts).
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
          createInputOf(req),
          // The master's deadline passed (or it went away): a create still waiting for a start slot leaves.
          context.signal,
        );
        return createResponseOf(placement);
      }),
    kill: (req) =>
      guard("Kill", { sandboxId: req.sandboxId }, async () => {
        await agent.kill(req.sandboxId, req.exec || undefined);
        return {};
      }),
    list: () =>
      guard("List", {}, async () => ({
        sandboxes: agent.list().map(sandboxInfoOf),
      })),
    stats: (req) =>
      guard("Stats", { sandboxId: req.sandboxId }, async () => {
        const stats = await agent.stats(req.sandboxId);
        const leaseEvents = req.envdAccessToken
          ? await agent.leaseEvents(req.sandboxId, req.envdAccessToken, Number(req.leaseEventsAfter))
          : [];
        return statsResponseOf(req.sandboxId, stats, leaseEvents);
      }),
    pause: (req) =>
      guard("Pause", { sandboxId: req.sandboxId }, async () => {
        await agent.pause(req.sandboxId, req.memory);
        return {};
      }),
    resume: (req) =>
      guard("Resume", { sandboxId: req.sandboxId }, async () => {
        return { placement: createResponseOf(await agent.resume(resumeInputOf(req))) };
      }),
    updateEgress: (req) =>
      guard("UpdateEgress", { sandboxId: req.sandboxId }, async () => {
        await agent.updateEgress(req.sandboxId, egressOf(req.egress));
        return {};
      }),
    logs: (req) =>
      guard("Logs", { sandboxId: req.sandboxId }, async () => ({
        lines: (await agent.logs(req.sandboxId, Math.min(req.limit || 1000, 10_000))).map(logLineMessage),
      })),
    snapshot: (req) =>
      guard("Snapshot", { sandboxId: req.sandboxId, snapshotId: req.snapshotId }, async () => ({
        snapshot: snapshotInfoOf(await agent.snapshot(req.sandboxId, req.snapshotId, req.filesOnly)),
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
          yield commandEventMessage(event);
        }
      } catch (error) {
        throw toConnectError(error);
      }
    },
    publishSnapshot: (req) =>
      guard("PublishSnapshot", { snapshotId: req.snapshotId }, async () => {
        const published = await agent.publishSnapshot(req.snapshotId, { ...req.labels });
        return {
          digest: published.digest,
          sizeBytes: BigInt(published.sizeBytes),
          uploadedBytes: BigInt(published.uploadedBytes),
        };
      }),
    pullSnapshot: (req) =>
      guard("PullSnapshot", { snapshotId: req.snapshotId, digest: req.digest }, async () => {
        const { snapshot, downloadedBytes } = await agent.pullSnapshot(req.snapshotId, req.digest);
        return { snapshot: snapshotInfoOf(snapshot), downloadedBytes: BigInt(downloadedBytes) };
      }),
    collectStoreLayers: (req) =>
      guard("CollectStoreLayers", {}, async () => ({
        removedLayers: await agent.collectStoreLayers(Number(req.graceMs)),
      })),
    listPublishedSnapshots: () =>
      guard("ListPublishedSnapshots", {}, async () => ({ snapshotIds: await agent.listPublishedSnapshots() })),
    unpublishSnapshot: (req) =>
      guard("UnpublishSnapshot", { snapshotId: req.snapshotId }, async () => {
        await agent.unpublishSnapshot(req.snapshotId);
        return {};
      }),
    importImage: (req) =>
      guard(
        "ImportImage",
        { snapshotId: req.snapshotId, image: req.debian ? `debian:${req.debian.suite}` : req.image },
        async () => {
          const credentials = req.username ? { username: req.username, password: req.password } : undefined;
          const source = req.debian
            ? {
                debian: {
                  suite: req.debian.suite,
                  packages: [...req.debian.packages],
                  aptPackages: [...req.debian.aptPackages],
                },
              }
            : { image: req.image, credentials };
          const imported = await agent.importImage(req.snapshotId, source);
          return {
            snapshot: snapshotInfoOf(imported.snapshot),
            resolved: imported.resolved,
            digest: imported.digest,
            env: [...imported.config.env],
            user: imported.config.user,
            workdir: imported.config.workdir,
            log: imported.log,
          };
        },
      ),
    adoptTemplate: (req) =>
      guard("AdoptTemplate", { templateId: req.templateId, snapshotId: req.snapshotId }, async () => {
        await agent.adoptTemplate(req.templateId, req.snapshotId, req.buildId);
        return {};
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
        snapshots: (await agent.listSnapshots()).map(snapshotInfoOf),
      })),
    async *exportSnapshot(req) {
      const data = await guard("ExportSnapshot", { snapshotId: req.snapshotId }, () =>
        agent.exportSnapshot(req.snapshotId, new Set(req.omitLayers)),
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
          // Binary: a snapshot's chunks would travel as base64 in JSON.
          createConnectTransport({ baseUrl: `http://${req.sourceAddr}`, httpVersion: "1.1", useBinaryFormat: true }),
        );
        // The source leaves out the layers this node has (a template's, an earlier move's).
        const omitLayers = [...(await agent.localLayers())];
        let transferredBytes = 0;
        const chunks = async function* () {
          for await (const chunk of source.exportSnapshot({ snapshotId: req.snapshotId, omitLayers })) {
            transferredBytes += chunk.data.byteLength;
            yield chunk.data;
          }
        };
        const snapshot = snapshotInfoOf(await agent.importSnapshot(req.snapshotId, chunks()));
        return { snapshot, transferredBytes: BigInt(transferredBytes) };
      }),
    info: () =>
      guard("Info", {}, async () => {
        return infoResponseOf(agent.info());
      }),
  };
}

export function nodeAgentRoutes(agent: NodeAgent, log: Logger): (router: ConnectRouter) => void {
  return (router) => {
    router.service(NodeAgentService, nodeAgentService(agent, log));
  };
}
