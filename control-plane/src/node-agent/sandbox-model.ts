import type { EnvdLeaseEvent } from "@warren/proto/envd-http";
import type { NodeHeartbeat, SandboxRoute } from "@warren/proto/redis";
import type { Instance, SandboxResources } from "../runtime/driver.js";
import type { EgressPolicy } from "../runtime/egress/policy.js";
import type { BuiltTemplate } from "../templates/store.js";
import { AgentError } from "./errors.js";

// What the node agent says about a sandbox: its inputs, its summary (kept as labels with its instance, so a
// restarted agent rebuilds it), where it runs, and its route in Redis.

export interface CreateSandboxInput {
  readonly sandboxId: string;
  readonly teamId: string;
  readonly templateId: string;
  /** Zero or absent fields take the template's defaults. */
  readonly resources?: Partial<Pick<SandboxResources, "cpuCount" | "memoryMB" | "diskSizeMB">>;
  readonly envVars?: Readonly<Record<string, string>>;
  readonly envdAccessToken?: string;
  readonly trafficTokenHash?: string;
  readonly publicTraffic?: boolean;
  readonly autoResume?: boolean;
  readonly metadata?: Readonly<Record<string, string>>;
  readonly defaultUser?: string;
  readonly defaultWorkdir?: string;
  /** Start from (and keep) warm sandboxes of the snapshot: a custom template's creates. */
  readonly warmPool?: boolean;
  /** E2B's network.maskRequestHost, written into the route. */
  readonly maskRequestHost?: string;
  /** Replaces the sandbox's start command (tests of failing starts only; never pooled). */
  readonly command?: readonly string[];
  /** Egress policy (E2B allowOut/denyOut, internet access folded in by the master); default: nothing leaves. */
  readonly egress?: EgressPolicy;
  /** Start from this snapshot on this node (`templateId` must be its template). */
  readonly snapshotId?: string;
  /** The access token envd holds in a memory snapshot (its source's), presented to /init to set the new one. */
  readonly snapshotEnvdAccessToken?: string;
  /** Team volumes bound read-write at these paths (an idmapped bind of WARREN_VOLUMES_DIR/<team>/<id>). */
  readonly volumeMounts?: readonly { readonly volumeId: string; readonly path: string }[];
}

export interface ResumeSandboxInput {
  readonly sandboxId: string;
  /** false: a cold start over the kept filesystem (new boot, processes lost), whatever the pause kept. */
  readonly memory: boolean;
  /** For envd's /init after a cold start (the same token as before: clients keep theirs). */
  readonly envVars?: Readonly<Record<string, string>>;
  readonly envdAccessToken?: string;
}

export interface SandboxPlacement {
  readonly sandboxId: string;
  readonly exec: string;
  readonly generation: number;
  readonly sandboxAddr: string;
  readonly envdUrl: string;
  readonly envdVersion: string;
  readonly pooled: boolean;
}

/** One entry of envd's process lease journal (`GET /warren/leases/events`, `@warren/proto/envd-http`). */
export type LeaseJournalEntry = EnvdLeaseEvent;

export interface SandboxSummary {
  readonly sandboxId: string;
  readonly exec: string;
  readonly generation: number;
  readonly instanceId: string;
  readonly templateId: string;
  readonly teamId: string;
  readonly sandboxAddr: string;
  readonly envdUrl: string;
  readonly resources: SandboxResources;
  readonly startedAt: number;
  readonly metadata: Readonly<Record<string, string>>;
  readonly paused: boolean;
}

/** What the agent reports of its node: the heartbeat contract's fields (`@warren/proto/redis`) but the time. */
export type NodeInfo = Omit<NodeHeartbeat, "updatedAt" | "servable"> & {
  /** Templates this node's driver may run (built or not); always sent by this agent. */
  readonly servable: readonly string[];
};

/** Limits on what a create may ask for; beyond them a request is refused as absurd. */
export const RESOURCE_LIMITS = {
  cpuCount: { min: 0.05, max: 64 },
  memoryMB: { min: 64, max: 256 * 1024 },
  diskSizeMB: { min: 64, max: 1024 * 1024 },
} as const;

/** The resources a create gets: the template's defaults where it asks for none (or 0), else what it asks within RESOURCE_LIMITS. */
export function resolveResources(template: BuiltTemplate, asked: CreateSandboxInput["resources"]): SandboxResources {
  const defaults = template.recipe.defaults;
  const pick = (name: keyof typeof RESOURCE_LIMITS, value: number | undefined, fallback: number) => {
    if (value === undefined || value === 0) return fallback;
    const { min, max } = RESOURCE_LIMITS[name];
    if (!Number.isFinite(value) || value < min || value > max) {
      throw new AgentError("invalid_argument", `${name} must be in [${min}, ${max}], got ${value}`);
    }
    return value;
  };
  return {
    cpuCount: pick("cpuCount", asked?.cpuCount, defaults.cpuCount),
    memoryMB: Math.round(pick("memoryMB", asked?.memoryMB, defaults.memoryMB)),
    diskSizeMB: Math.round(pick("diskSizeMB", asked?.diskSizeMB, defaults.diskSizeMB)),
    pidsMax: defaults.pidsMax,
  };
}

/** The sandbox an instance carries in its labels; undefined for an instance that is no sandbox (a warm one). */
export function summaryOf(instance: Instance): SandboxSummary | undefined {
  const labels = instance.labels;
  if (!labels.sandboxId || !labels.exec) return undefined;
  let metadata: Record<string, string> = {};
  try {
    metadata = JSON.parse(labels.metadata ?? "{}") as Record<string, string>;
  } catch {
    metadata = {};
  }
  return {
    sandboxId: labels.sandboxId,
    exec: labels.exec,
    generation: Number(labels.generation ?? 0),
    instanceId: instance.instanceId,
    templateId: instance.templateId,
    teamId: labels.teamId ?? "",
    sandboxAddr: instance.addr,
    envdUrl: instance.envdUrl,
    resources: instance.resources,
    startedAt: instance.createdAt,
    metadata,
    paused: instance.paused,
  };
}

export function placementOf(summary: SandboxSummary): SandboxPlacement {
  return {
    sandboxId: summary.sandboxId,
    exec: summary.exec,
    generation: summary.generation,
    sandboxAddr: summary.sandboxAddr,
    envdUrl: summary.envdUrl,
    envdVersion: "",
    pooled: false,
  };
}

/** The sandbox's route for the proxies (the `@warren/proto/redis` contract); traffic settings come from its instance's labels. */
export function sandboxRoute(
  summary: SandboxSummary,
  labels: Readonly<Record<string, string>>,
  node: { readonly nodeId: string; readonly nodeAddr: string },
): SandboxRoute {
  return {
    sandboxId: summary.sandboxId,
    exec: summary.exec,
    generation: summary.generation,
    node: node.nodeId,
    nodeAddr: node.nodeAddr,
    sandboxAddr: summary.sandboxAddr,
    ports: {},
    state: summary.paused ? "paused" : "running",
    team: summary.teamId,
    public: labels.publicTraffic === "1",
    trafficTokenHash: labels.trafficTokenHash ?? "",
    autoResume: labels.autoResume === "1",
    maskRequestHost: labels.maskRequestHost ?? "",
    ...(labels.defaultUser ? { defaultUser: labels.defaultUser } : {}),
  };
}
