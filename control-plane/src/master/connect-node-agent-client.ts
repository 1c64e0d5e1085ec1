import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  type CreateResponse,
  NodeAgentService,
  SandboxState,
  type SnapshotInfo,
} from "@warren/proto/nodeagent/v1/node_agent_pb";
import {
  type NodeAgentClient,
  type NodeAgentConnector,
  NodeAgentError,
  type SandboxPlacement,
  type SnapshotOnNode,
} from "./node-agent-client.js";

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

function placement(response: CreateResponse | undefined): SandboxPlacement {
  if (!response) throw new NodeAgentError("failed", "node agent answered without a placement");
  return {
    exec: response.exec,
    sandboxAddr: response.sandboxAddr,
    envdUrl: response.envdUrl,
    ...(response.envdVersion ? { envdVersion: response.envdVersion } : {}),
  };
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
    this.client = createClient(NodeAgentService, createConnectTransport({ baseUrl, httpVersion }));
  }

  create: NodeAgentClient["create"] = (request) =>
    call(async () => {
      // A template the node does not have is a refusal (another node may have it), not "no such sandbox".
      try {
        const response = await this.client.create(
          {
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
            allowInternetAccess: request.allowInternetAccess ?? false,
            egress: { allowOut: [...request.egress.allowOut], denyOut: [...request.egress.denyOut] },
            snapshotId: request.snapshotId ?? "",
            snapshotEnvdAccessToken: request.snapshotEnvdAccessToken ?? "",
            maskRequestHost: request.maskRequestHost ?? "",
            warmPool: request.warmPool === true,
            defaultUser: request.defaultUser ?? "",
            defaultWorkdir: request.defaultWorkdir ?? "",
            volumeMounts: (request.volumeMounts ?? []).map((m) => ({ volumeId: m.volumeId, path: m.path })),
          },
          { timeoutMs: TIMEOUT_MS.create },
        );
        return placement(response);
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
      const response = await this.client.list({}, { timeoutMs: TIMEOUT_MS.list });
      return response.sandboxes.map((sandbox) => ({
        sandboxId: sandbox.sandboxId,
        exec: sandbox.exec,
        state: sandbox.state === SandboxState.PAUSED ? ("paused" as const) : ("running" as const),
      }));
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
      return {
        memoryUsageBytes: Number(response.memoryUsageBytes),
        memoryLimitBytes: Number(response.memoryLimitBytes),
        cpuUsageUsec: Number(response.cpuUsageUsec),
        diskUsageBytes: Number(response.diskUsageBytes),
        diskLimitBytes: Number(response.diskLimitBytes),
        oomKills: response.oomKills,
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
      return placement(response.placement);
    });

  logs: NodeAgentClient["logs"] = (sandboxId, limit) =>
    call(async () => {
      const response = await this.client.logs({ sandboxId, limit }, { timeoutMs: TIMEOUT_MS.list });
      return response.lines.map((line) => ({
        timestampMs: Number(line.timestampMs),
        level: line.level,
        message: line.message,
        fields: { ...line.fields },
      }));
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
      if (!response.snapshot) throw new NodeAgentError("failed", "node agent answered without a snapshot");
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
          const event = message.event;
          if (event.case === "pid") yield { kind: "pid" as const, pid: event.value };
          else if (event.case === "stdout" || event.case === "stderr") yield { kind: event.case, data: event.value };
          else if (event.case === "exit") {
            yield { kind: "exit" as const, exitCode: event.value.exitCode, status: event.value.status };
          }
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
      return { digest: response.digest, sizeBytes: Number(response.sizeBytes) };
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
      if (!response.snapshot) throw new NodeAgentError("failed", "node agent answered without a snapshot");
      return snapshotOnNode(response.snapshot);
    });

  importImage: NodeAgentClient["importImage"] = (snapshotId, image, credentials) =>
    call(async () => {
      const response = await this.client.importImage(
        { snapshotId, image, username: credentials?.username ?? "", password: credentials?.password ?? "" },
        { timeoutMs: TIMEOUT_MS.transfer },
      );
      if (!response.snapshot) throw new NodeAgentError("failed", "node agent answered without a snapshot");
      return {
        snapshot: snapshotOnNode(response.snapshot),
        resolved: response.resolved,
        digest: response.digest,
        env: [...response.env],
        user: response.user,
        workdir: response.workdir,
        log: [...response.log],
      };
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
      if (!response.snapshot) throw new NodeAgentError("failed", "node agent answered without a snapshot");
      return snapshotOnNode(response.snapshot);
    });

  listSnapshots: NodeAgentClient["listSnapshots"] = () =>
    call(async () => {
      const response = await this.client.listSnapshots({}, { timeoutMs: TIMEOUT_MS.list });
      return response.snapshots.map(snapshotOnNode);
    });
}

function snapshotOnNode(info: SnapshotInfo): SnapshotOnNode {
  return {
    snapshotId: info.snapshotId,
    templateId: info.templateId,
    driver: info.driver,
    memory: info.memory,
    sizeBytes: Number(info.sizeBytes),
    createdAt: new Date(Number(info.createdAt)),
  };
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
