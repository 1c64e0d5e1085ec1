import type { ResumeRequest, RunCommandRequest } from "@warren/proto/nodeagent/v1/node_agent_pb";
import type { EgressPolicy } from "../runtime/egress/policy.js";

/**
 * What the master needs from a node agent. The Connect adapter (`connect-node-agent-client.ts`) maps it onto
 * `warren.nodeagent.v1.NodeAgentService`; tests use an in-process fake.
 */

export interface SandboxResources {
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
}

export interface CreateOnNodeRequest {
  readonly sandboxId: string;
  readonly teamId: string;
  readonly templateId: string;
  readonly resources: SandboxResources;
  readonly envVars: Readonly<Record<string, string>>;
  /** The envd access token the node passes to envd's /init; never logged. */
  readonly envdAccessToken: string;
  /** SHA-256 hex of the traffic token (route field), empty when traffic is public. */
  readonly trafficTokenHash: string;
  readonly publicTraffic: boolean;
  readonly autoResume: boolean;
  readonly metadata: Readonly<Record<string, string>>;
  /** The policy the node enforces (E2B's network config and internet access folded in with the team's mode). */
  readonly egress: EgressPolicy;
  /** Start from this snapshot, which is on this node. */
  readonly snapshotId?: string;
  /** A memory snapshot's envd holds its source's access token: the node presents it to /init. Never logged. */
  readonly snapshotEnvdAccessToken?: string;
  /** Keep and use warm sandboxes of `snapshotId` on the node (a custom template's creates). */
  readonly warmPool?: boolean;
  /** E2B's network.maskRequestHost (a route field); empty: the client's Host goes through. */
  readonly maskRequestHost?: string;
  /** envd's default user and working directory (a custom template's last USER/WORKDIR); absent: `user`, home. */
  readonly defaultUser?: string;
  readonly defaultWorkdir?: string;
  /** The team's volumes bound at these paths. */
  readonly volumeMounts?: readonly { readonly volumeId: string; readonly path: string }[];
}

/**
 * A command for a sandbox's envd (RunCommand): `/bin/bash -l -c <command>` as `user` (empty: root), in `cwd`
 * (empty: the user's home), `timeoutMs` 0: no limit but the caller's signal. The wire's fields as they are.
 */
export type CommandOnNode = Readonly<Pick<RunCommandRequest, "command" | "user" | "cwd" | "env" | "timeoutMs">>;

export type CommandEventOnNode =
  | { readonly kind: "pid"; readonly pid: number }
  | { readonly kind: "stdout" | "stderr"; readonly data: Uint8Array }
  | { readonly kind: "exit"; readonly exitCode: number; readonly status: string };

/** An image a node pulled and keeps as a snapshot (ImportImage). */
/** Where a template base comes from: an image in a registry, or a Debian suite and packages made on the node. */
export type ImageSource =
  | {
      readonly image: string;
      readonly credentials: { readonly username: string; readonly password: string } | undefined;
    }
  | {
      readonly debian: {
        readonly suite: string;
        readonly packages: readonly string[];
        readonly aptPackages?: readonly string[];
      };
    };

export interface ImportedImage {
  readonly snapshot: SnapshotOnNode;
  readonly resolved: string;
  readonly digest: string;
  /** The image config's environment, `K=V`. */
  readonly env: readonly string[];
  readonly user: string;
  readonly workdir: string;
  readonly log: readonly string[];
}

/** A snapshot as the node made it. */
export interface SnapshotOnNode {
  readonly snapshotId: string;
  readonly templateId: string;
  readonly driver: string;
  readonly memory: boolean;
  readonly sizeBytes: number;
  readonly createdAt: Date;
}

/** One line of a sandbox's own log (envd's JSON lines, or plain text PID 1 printed). */
export interface SandboxLogLine {
  readonly timestampMs: number;
  readonly level: string;
  readonly message: string;
  readonly fields: Readonly<Record<string, string>>;
}

/** Where a sandbox started on a node can be reached. */
export interface SandboxPlacement {
  /** Incarnation id (changes on every start and resume); the route's `exec`. */
  readonly exec: string;
  /** The sandbox's address as reachable from the node. */
  readonly sandboxAddr: string;
  /** envd's base URL as reachable from the node. */
  readonly envdUrl: string;
  readonly envdVersion?: string;
}

export interface SandboxOnNode {
  readonly sandboxId: string;
  readonly exec: string;
  readonly state: "running" | "paused";
}

/** A sandbox's resource use on its node, now. */
export interface SandboxStats {
  readonly memoryUsageBytes: number;
  readonly memoryLimitBytes: number;
  /** CPU time used since the sandbox started, microseconds. */
  readonly cpuUsageUsec: number;
  readonly diskUsageBytes: number;
  readonly diskLimitBytes: number;
  /** Processes the kernel killed at the sandbox's memory limit since it started. */
  readonly oomKills?: number;
  /** The latest of those kills by name, oldest first (empty where the node cannot tell). */
  readonly oomVictims?: readonly OomVictimOnNode[];
  /** envd's process lease journal after the asked sequence number (only when the envd token was given). */
  readonly leaseEvents?: readonly LeaseEventOnNode[];
}

export interface OomVictimOnNode {
  readonly process: string;
  readonly memoryBytes: number;
  readonly at: string;
}

export interface LeaseEventOnNode {
  readonly seq: number;
  readonly type: string;
  readonly pid: number;
  readonly tag: string;
  readonly ttlMs: number;
  readonly signal: string;
  readonly at: string;
}

/** A Resume as the wire has it (`memory` false: cold boot from the filesystem snapshot). */
export type ResumeOnNodeRequest = Readonly<
  Pick<ResumeRequest, "sandboxId" | "teamId" | "envdAccessToken" | "envVars" | "memory">
>;

/**
 * Why a node agent said no. `refused` means "try another node" (no capacity, template missing, draining);
 * `not_found` means the node does not have that sandbox; `unimplemented` means the node cannot do that yet
 * (pause/resume before the pause issue); anything else is a failure of the call itself.
 */
export type NodeAgentErrorKind = "refused" | "not_found" | "unavailable" | "unimplemented" | "failed";

export class NodeAgentError extends Error {
  constructor(
    readonly kind: NodeAgentErrorKind,
    message: string,
  ) {
    super(message);
    this.name = "NodeAgentError";
  }
}

/**
 * A refusal that goes away on its own: the node is building the template for its first use, or its agent is
 * still re-adopting sandboxes after a start (the node agent's UNAVAILABLE answers say which; a node that does not
 * answer at all is not one of these).
 */
export function isStillPreparing(error: unknown): boolean {
  return (
    error instanceof NodeAgentError &&
    error.kind === "unavailable" &&
    /is being built on this node|node agent is starting/.test(error.message)
  );
}

export interface NodeAgentClient {
  /** Starts the sandbox (pooled or fresh), initialises envd, writes the route; resolves once envd answers. */
  create(request: CreateOnNodeRequest): Promise<SandboxPlacement>;
  /** Kills the sandbox and deletes its route; not_found when the node does not have it. */
  kill(sandboxId: string): Promise<void>;
  list(): Promise<SandboxOnNode[]>;
  /** With `leases`, envd's process lease journal after `leases.after` comes along (the token is never logged). */
  stats(
    sandboxId: string,
    leases?: { readonly envdAccessToken: string; readonly after: number },
  ): Promise<SandboxStats>;
  pause(sandboxId: string, memory: boolean): Promise<void>;
  resume(request: ResumeOnNodeRequest): Promise<SandboxPlacement>;
  /** Replaces a running or paused sandbox's egress policy; not_found when the node does not have it. */
  updateEgress(sandboxId: string, egress: EgressPolicy): Promise<void>;
  /** The newest `limit` lines of the sandbox's own log (envd), oldest first; not_found when not on the node. */
  logs(sandboxId: string, limit: number): Promise<SandboxLogLine[]>;
  /** Captures the sandbox as a snapshot on the node (it runs on, or stays paused); not_found when not there. */
  snapshot(sandboxId: string, snapshotId: string, options?: { readonly filesOnly?: boolean }): Promise<SnapshotOnNode>;
  /**
   * Runs a command in a running sandbox through its envd (template builds); the events end with its exit.
   * Aborting `signal` stops the stream and leaves the process running.
   */
  runCommand(
    sandboxId: string,
    envdAccessToken: string,
    command: CommandOnNode,
    signal: AbortSignal,
  ): AsyncIterable<CommandEventOnNode>;
  /** Publishes a snapshot of the node to the cluster's store; resolves with its content digest. */
  publishSnapshot(
    snapshotId: string,
    labels: Readonly<Record<string, string>>,
  ): Promise<{ digest: string; sizeBytes: number; uploadedBytes: number }>;
  /** The snapshot ids published to the cluster's store. */
  listPublishedSnapshots(): Promise<string[]>;
  /** Removes a published snapshot from the cluster's store; idempotent. */
  unpublishSnapshot(snapshotId: string): Promise<void>;
  /** Removes the store's layers no published snapshot stacks but those pushed less than `graceMs` ago. */
  collectStoreLayers(graceMs: number): Promise<string[]>;
  /** Pulls a published snapshot onto the node (digests checked, only the layers it lacks); at once when it has it. */
  pullSnapshot(snapshotId: string, digest: string): Promise<SnapshotOnNode & Transferred>;
  /**
   * Pulls an OCI image (or makes a Debian system: Warren's own recipes, never a team's request) and keeps its
   * prepared rootfs as a files-only snapshot over `scratch` on the node.
   */
  importImage(snapshotId: string, source: ImageSource): Promise<ImportedImage>;
  /** Hands a shipped template the node awaits over to it: the build's ready snapshot becomes its node template. */
  adoptTemplate(templateId: string, snapshotId: string, buildId: string): Promise<void>;
  /** Writes a file (as root, parents created) into a running sandbox through its envd. */
  writeFile(sandboxId: string, envdAccessToken: string, path: string, data: Uint8Array): Promise<void>;
  /** Deletes a snapshot's files on the node; idempotent. */
  deleteSnapshot(snapshotId: string): Promise<void>;
  listSnapshots(): Promise<SnapshotOnNode[]>;
  /** Copies a snapshot from the node agent at `sourceAddr` to this node (moving a paused sandbox). */
  importSnapshot(snapshotId: string, sourceAddr: string): Promise<SnapshotOnNode & Transferred>;
}

/** What crossed to the node: the layers it already had are not moved again. */
export interface Transferred {
  readonly transferredBytes: number;
}

/** Gives the client for a node at `addr` (host:port), reusing connections. */
export type NodeAgentConnector = (nodeId: string, addr: string) => NodeAgentClient;
