import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { NodeAgentService } from "@warren/proto/nodeagent/v1/node_agent_pb";
import { type NodeAgentClient, type NodeAgentConnector, NodeAgentError } from "./node-agent-client.js";
import {
  commandEventOf,
  createRequestMessage,
  importedImageOf,
  logLinesOf,
  placementOf,
  sandboxesOnNode,
  snapshotOnNode,
  statsOf,
} from "./node-agent-messages.js";

/** Node agent refusals that mean "try another node"; everything else is a failure of this node. */
function toNodeAgentError(error: unknown): NodeAgentError {
  const e = ConnectError.from(error);
  switch (e.code) {
    case Code.NotFound:
      return new NodeAgentError("not_found", e.rawMessage);
    case Code.ResourceExhausted:
    case Code.FailedPrecondition:
    case Code.AlreadyExists:
      return new NodeAgentError("refused", e.rawMessage);
    case Code.Unimplemented:
      return new NodeAgentError("unimplemented", e.rawMessage);
    case Code.Unavailable:
    case Code.DeadlineExceeded:
      return new NodeAgentError("unavailable", e.rawMessage);
    default:
      return new NodeAgentError("failed", `${Code[e.code]}: ${e.rawMessage}`);
  }
}

async function call<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw toNodeAgentError(error);
  }
}

/** Upper bounds per call, so a hung node agent cannot hold a transition (or the master's shutdown) forever. */
const TIMEOUT_MS = {
  create: 120_000,
  resume: 120_000,
  pause: 120_000,
  snapshot: 300_000,
  /** Publishing to and pulling from the store: a template of gigabytes over a slow registry. */
  transfer: 1_800_000,
  kill: 30_000,
  list: 10_000,
} as const;

/** NodeAgentClient over `warren.nodeagent.v1.NodeAgentService` (Connect protocol). */
export class ConnectNodeAgentClient implements NodeAgentClient {
  private readonly client: Client<typeof NodeAgentService>;

  constructor(addr: string, httpVersion: "1.1" | "2" = "1.1") {
    const baseUrl = addr.includes("://") ? addr : `http://${addr}`;
    // Binary protobuf: the control plane's own calls need no readable bodies, and JSON's encoding cost ~ms per call.
    this.client = createClient(
      NodeAgentService,
      createConnectTransport({ baseUrl, httpVersion, useBinaryFormat: true }),
    );
  }

  create: NodeAgentClient["create"] = (request) =>
    call(async () => {
      // A template the node does not have is a refusal (another node may have it), not "no such sandbox".
      try {
        const response = await this.client.create(createRequestMessage(request), {
          timeoutMs: TIMEOUT_MS.create,
        });
        return placementOf(response);
      } catch (error) {
        const e = ConnectError.from(error);
        if (e.code === Code.NotFound) throw new ConnectError(e.rawMessage, Code.FailedPrecondition);
        throw e;
      }
    });

  kill: NodeAgentClient["kill"] = (sandboxId) =>
    call(async () => {
      await this.client.kill({ sandboxId }, { timeoutMs: TIMEOUT_MS.kill });
    });

  list: NodeAgentClient["list"] = () =>
    call(async () => {
      return sandboxesOnNode(await this.client.list({}, { timeoutMs: TIMEOUT_MS.list }));
    });

  stats: NodeAgentClient["stats"] = (sandboxId, leases) =>
    call(async () => {
      const response = await this.client.stats(
        {
          sandboxId,
          ...(leases ? { envdAccessToken: leases.envdAccessToken, leaseEventsAfter: BigInt(leases.after) } : {}),
        },
        { timeoutMs: TIMEOUT_MS.list },
      );
      return statsOf(response);
    });

  pause: NodeAgentClient["pause"] = (sandboxId, memory) =>
    call(async () => {
      await this.client.pause({ sandboxId, memory }, { timeoutMs: TIMEOUT_MS.pause });
    });

  resume: NodeAgentClient["resume"] = (request) =>
    call(async () => {
      const response = await this.client.resume(
        {
          sandboxId: request.sandboxId,
          teamId: request.teamId,
          envdAccessToken: request.envdAccessToken,
          envVars: { ...request.envVars },
          memory: request.memory,
        },
        { timeoutMs: TIMEOUT_MS.resume },
      );
      return placementOf(response.placement);
    });

  logs: NodeAgentClient["logs"] = (sandboxId, limit) =>
    call(async () => {
      return logLinesOf(await this.client.logs({ sandboxId, limit }, { timeoutMs: TIMEOUT_MS.list }));
    });

  updateEgress: NodeAgentClient["updateEgress"] = (sandboxId, egress) =>
    call(async () => {
      await this.client.updateEgress(
        { sandboxId, egress: { allowOut: [...egress.allowOut], denyOut: [...egress.denyOut] } },
        { timeoutMs: TIMEOUT_MS.kill },
      );
    });

  snapshot: NodeAgentClient["snapshot"] = (sandboxId, snapshotId, options) =>
    call(async () => {
      const response = await this.client.snapshot(
        { sandboxId, snapshotId, filesOnly: options?.filesOnly === true },
        { timeoutMs: TIMEOUT_MS.snapshot },
      );
      return snapshotOnNode(response.snapshot);
    });

  runCommand: NodeAgentClient["runCommand"] = (sandboxId, envdAccessToken, command, signal) => {
    const stream = this.client.runCommand(
      {
        sandboxId,
        envdAccessToken,
        command: command.command,
        user: command.user,
        cwd: command.cwd,
        env: { ...command.env },
        timeoutMs: command.timeoutMs,
      },
      { signal },
    );
    return (async function* () {
      try {
        for await (const message of stream) {
          const event = commandEventOf(message);
          if (event) yield event;
        }
      } catch (error) {
        throw toNodeAgentError(error);
      }
    })();
  };

  publishSnapshot: NodeAgentClient["publishSnapshot"] = (snapshotId, labels) =>
    call(async () => {
      const response = await this.client.publishSnapshot(
        { snapshotId, labels: { ...labels } },
        { timeoutMs: TIMEOUT_MS.transfer },
      );
      return {
        digest: response.digest,
        sizeBytes: Number(response.sizeBytes),
        uploadedBytes: Number(response.uploadedBytes),
      };
    });

  listPublishedSnapshots: NodeAgentClient["listPublishedSnapshots"] = () =>
    call(async () => {
      const response = await this.client.listPublishedSnapshots({}, { timeoutMs: TIMEOUT_MS.transfer });
      return [...response.snapshotIds];
    });

  unpublishSnapshot: NodeAgentClient["unpublishSnapshot"] = (snapshotId) =>
    call(async () => {
      await this.client.unpublishSnapshot({ snapshotId }, { timeoutMs: TIMEOUT_MS.transfer });
    });

  pullSnapshot: NodeAgentClient["pullSnapshot"] = (snapshotId, digest) =>
    call(async () => {
      const response = await this.client.pullSnapshot({ snapshotId, digest }, { timeoutMs: TIMEOUT_MS.transfer });
      return { ...snapshotOnNode(response.snapshot), transferredBytes: Number(response.downloadedBytes) };
    });

  collectStoreLayers: NodeAgentClient["collectStoreLayers"] = (graceMs) =>
    call(async () => {
      const response = await this.client.collectStoreLayers(
        { graceMs: BigInt(graceMs) },
        { timeoutMs: TIMEOUT_MS.transfer },
      );
      return [...response.removedLayers];
    });

  importImage: NodeAgentClient["importImage"] = (snapshotId, source) =>
    call(async () => {
      const credentials = "image" in source ? source.credentials : undefined;
      const response = await this.client.importImage(
        {
          snapshotId,
          ...("image" in source
            ? { image: source.image }
            : {
                debian: {
                  suite: source.debian.suite,
                  packages: [...source.debian.packages],
                  aptPackages: [...(source.debian.aptPackages ?? [])],
                },
              }),
          username: credentials?.username ?? "",
          password: credentials?.password ?? "",
        },
        { timeoutMs: TIMEOUT_MS.transfer },
      );
      return importedImageOf(response);
    });

  adoptTemplate: NodeAgentClient["adoptTemplate"] = (templateId, snapshotId, buildId) =>
    call(async () => {
      await this.client.adoptTemplate({ templateId, snapshotId, buildId }, { timeoutMs: TIMEOUT_MS.transfer });
    });

  writeFile: NodeAgentClient["writeFile"] = (sandboxId, envdAccessToken, path, data) =>
    call(async () => {
      await this.client.writeFile({ sandboxId, envdAccessToken, path, data }, { timeoutMs: TIMEOUT_MS.snapshot });
    });

  deleteSnapshot: NodeAgentClient["deleteSnapshot"] = (snapshotId) =>
    call(async () => {
      await this.client.deleteSnapshot({ snapshotId }, { timeoutMs: TIMEOUT_MS.kill });
    });

  importSnapshot: NodeAgentClient["importSnapshot"] = (snapshotId, sourceAddr) =>
    call(async () => {
      const response = await this.client.importSnapshot({ snapshotId, sourceAddr }, { timeoutMs: TIMEOUT_MS.snapshot });
      return { ...snapshotOnNode(response.snapshot), transferredBytes: Number(response.transferredBytes) };
    });

  listSnapshots: NodeAgentClient["listSnapshots"] = () =>
    call(async () => {
      const response = await this.client.listSnapshots({}, { timeoutMs: TIMEOUT_MS.list });
      return response.snapshots.map((info) => snapshotOnNode(info));
    });
}

/** One client per node address, created on first use. */
export function connectNodeAgents(httpVersion: "1.1" | "2" = "1.1"): NodeAgentConnector {
  const clients = new Map<string, ConnectNodeAgentClient>();
  return (_nodeId, addr) => {
    let client = clients.get(addr);
    if (!client) {
      client = new ConnectNodeAgentClient(addr, httpVersion);
      clients.set(addr, client);
    }
    return client;
  };
}
