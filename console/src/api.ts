import type { ExecPolicy } from "@warren/proto/exec-policy";
import { authHeaders, type Credential } from "./session.js";

export type { ExecAction, ExecPolicy, ExecRule } from "@warren/proto/exec-policy";

/** A failed api call: the HTTP status and the api's own message (E2B error bodies carry `message`). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

export interface ListedSandbox {
  readonly sandboxID: string;
  readonly templateID: string;
  readonly alias?: string;
  readonly startedAt: string;
  readonly endAt: string;
  readonly state: "running" | "paused";
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
  readonly metadata: Record<string, string>;
  /** Warren extra: the node it is placed on (null until placed; absent from an api older than the field). */
  readonly nodeID?: string | null;
}

export interface SandboxDetail extends ListedSandbox {
  readonly lifecycle?: { readonly onTimeout: "pause" | "kill"; readonly autoResume: boolean };
}

/** What create/connect answer: the envd access token the console needs for files and the terminal. */
export interface SandboxAccess {
  readonly sandboxID: string;
  readonly envdAccessToken: string;
  readonly domain: string | null;
}

export interface LedgerEvent {
  readonly id: string;
  readonly sandboxID: string;
  readonly type: string;
  readonly fromState: string | null;
  readonly toState: string | null;
  readonly data: Record<string, unknown> | null;
  readonly timestamp: string;
}

export interface MetricSample {
  readonly timestampUnix: number;
  readonly cpuCount: number;
  readonly cpuUsedPct: number;
  readonly memUsed: number;
  readonly memTotal: number;
  readonly diskUsed: number;
  readonly diskTotal: number;
}

export interface LogEntry {
  readonly timestamp: string;
  readonly level: string;
  readonly message: string;
  readonly fields: Record<string, string>;
}

export interface Template {
  readonly templateID: string;
  readonly buildID: string;
  readonly buildStatus: string;
  readonly names: string[];
  readonly aliases: string[];
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly public: boolean;
  readonly createdAt: string;
  readonly spawnCount: number;
  readonly buildCount: number;
}

export interface TemplateBuild {
  readonly buildID: string;
  readonly status: string;
  readonly createdAt: string;
  readonly finishedAt?: string;
}

export interface TemplateDetail extends Template {
  readonly builds: TemplateBuild[];
}

export interface TemplateTag {
  readonly tag: string;
  readonly buildID: string;
  readonly createdAt: string;
}

export interface BuildLogEntry {
  readonly timestamp: string;
  readonly level: string;
  readonly message: string;
  readonly step?: string;
}

export interface ClusterNode {
  readonly id: string;
  readonly addr: string;
  readonly state: "up" | "down";
  readonly lastSeenAt: string;
  readonly cordonedAt: string | null;
}

export interface Team {
  readonly id: string;
  readonly name: string;
  readonly maxConcurrentSandboxes: number;
  readonly maxLengthHours: number;
  readonly maxCreatesPerMinute: number;
  readonly egressMode: string;
}

/** A team's API key as the admin listing shows it (never the key itself). */
export interface ApiKeyInfo {
  readonly id: string;
  readonly name: string;
  readonly prefix: string;
  readonly createdAt: string;
  readonly revokedAt: string | null;
  /** May change the team's exec policy and approve its reviews (absent from an api older than the field). */
  readonly approver?: boolean;
}

/** E2B `SnapshotInfo` as `GET /snapshots` lists it, plus Warren's memory and size. */
export interface SnapshotInfo {
  /** The reference sandboxes are created from, like a template id (`<namespace>/<name>:default` or `<id>:default`). */
  readonly snapshotID: string;
  readonly names: string[];
  /** The sandbox it was taken from (it may be gone since). */
  readonly sandboxID: string;
  readonly createdAt: string;
  /** Processes and memory kept (false: files only, sandboxes from it boot fresh). */
  readonly memory?: boolean;
  readonly sizeBytes?: number;
}

export type ApprovalState = "pending" | "approved" | "rejected" | "used" | "expired";

/** A request an exec policy's `review` rule held back (control-plane api/exec-policy.ts approvalView). */
export interface ExecApproval {
  readonly approvalID: string;
  readonly sandboxID: string;
  /** A process start, or an envd file write or remove. */
  readonly kind: "start" | "write" | "remove";
  readonly request: {
    readonly commandLine?: string;
    readonly cmd?: string;
    readonly args?: string[];
    readonly cwd?: string;
    readonly user: string;
    /** Names only, never values. */
    readonly envNames?: string[];
    readonly path?: string;
  };
  readonly rule: string;
  readonly state: ApprovalState;
  readonly requestedAt: string;
  readonly expiresAt: string;
  /** The approver key's id. */
  readonly decidedBy: string | null;
  readonly decidedAt: string | null;
  readonly reason: string | null;
  readonly usedAt: string | null;
}

export interface CreatedKey {
  readonly id: string;
  readonly key: string;
  readonly prefix: string;
}

/** Served by the api next to the bundle (control-plane/src/api/console.ts). */
export interface ConsoleSettings {
  /** `{port}` and `{sandboxID}` template of a sandbox port's URL through the proxy; null when not configured. */
  readonly sandboxUrl: string | null;
}

async function errorOf(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => "");
  let message = text.trim() || res.statusText || `HTTP ${res.status}`;
  try {
    const parsed = JSON.parse(text) as { message?: unknown };
    if (typeof parsed.message === "string") message = parsed.message;
  } catch {
    // Not JSON: the plain text is the message.
  }
  return new ApiError(res.status, message);
}

/** The REST api the SDKs use, same origin as the console, authenticated by the signed-in credential. */
export class WarrenApi {
  constructor(
    readonly credential: Credential,
    private readonly base = "",
  ) {}

  async request<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.send(method, path, body, signal);
    if (res.status === 204) return undefined as T;
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** The api's answer when it is a success (2xx), else its message as an ApiError. */
  private async send(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = { ...authHeaders(this.credential), Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res: Response;
    try {
      res = await fetch(this.base + path, {
        method,
        headers,
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        ...(signal ? { signal } : {}),
      });
    } catch (error) {
      if ((error as Error).name === "AbortError") throw error;
      throw new ApiError(0, `the api did not answer ${method} ${path}: ${(error as Error).message}`);
    }
    if (!res.ok) throw await errorOf(res);
    return res;
  }

  listSandboxes(): Promise<ListedSandbox[]> {
    return this.request("GET", "/v2/sandboxes?state=running,paused&limit=100");
  }
  getSandbox(id: string): Promise<SandboxDetail> {
    return this.request("GET", `/sandboxes/${encodeURIComponent(id)}`);
  }
  createSandbox(templateID: string, timeout: number, metadata: Record<string, string>): Promise<SandboxAccess> {
    return this.request("POST", "/sandboxes", { templateID, timeout, metadata });
  }
  /** The envd access token of a running sandbox; extends its timeout only if it would end sooner (never shortens). */
  connectSandbox(id: string): Promise<SandboxAccess> {
    return this.request("POST", `/sandboxes/${encodeURIComponent(id)}/connect`, { timeout: 60 });
  }
  killSandbox(id: string): Promise<void> {
    return this.request("DELETE", `/sandboxes/${encodeURIComponent(id)}`);
  }
  pauseSandbox(id: string): Promise<void> {
    return this.request("POST", `/sandboxes/${encodeURIComponent(id)}/pause`, {});
  }
  resumeSandbox(id: string, timeout: number): Promise<SandboxAccess> {
    return this.request("POST", `/sandboxes/${encodeURIComponent(id)}/resume`, { timeout });
  }
  snapshot(id: string): Promise<{ snapshotID: string; names: string[] }> {
    return this.request("POST", `/sandboxes/${encodeURIComponent(id)}/snapshots`, {});
  }
  fork(id: string): Promise<({ sandbox: SandboxAccess } | { error: { code: string; message: string } })[]> {
    return this.request("POST", `/sandboxes/${encodeURIComponent(id)}/fork`, { count: 1 });
  }
  setTimeout(id: string, timeout: number): Promise<void> {
    return this.request("POST", `/sandboxes/${encodeURIComponent(id)}/timeout`, { timeout });
  }
  metrics(id: string): Promise<MetricSample[]> {
    return this.request("GET", `/sandboxes/${encodeURIComponent(id)}/metrics`);
  }
  /** The newest 1000 entries, oldest first. */
  async logs(id: string): Promise<{ logs: LogEntry[] }> {
    const page = await this.request<{ logs: LogEntry[] }>(
      "GET",
      `/v2/sandboxes/${encodeURIComponent(id)}/logs?limit=1000&direction=backward`,
    );
    return { logs: page.logs.reverse() };
  }
  events(id: string | undefined, cursor: string, limit: number): Promise<{ events: LedgerEvent[]; cursor: string }> {
    const scope = id ? `/warren/v1/sandboxes/${encodeURIComponent(id)}/events` : "/warren/v1/events";
    return this.request("GET", `${scope}?cursor=${encodeURIComponent(cursor)}&limit=${limit}`);
  }

  /** One page of the team's snapshots, newest first; `nextToken` when more remain. */
  async listSnapshots(nextToken?: string): Promise<{ snapshots: SnapshotInfo[]; nextToken: string | undefined }> {
    const query = nextToken ? `&nextToken=${encodeURIComponent(nextToken)}` : "";
    const res = await this.send("GET", `/snapshots?limit=100${query}`);
    return { snapshots: (await res.json()) as SnapshotInfo[], nextToken: res.headers.get("X-Next-Token") ?? undefined };
  }
  /** E2B's deleteSnapshot: the snapshot's reference through the templates path. */
  deleteSnapshot(snapshotID: string): Promise<void> {
    return this.request("DELETE", `/templates/${encodeURIComponent(snapshotID)}`);
  }

  listTemplates(): Promise<Template[]> {
    return this.request("GET", "/templates");
  }
  getTemplate(id: string): Promise<TemplateDetail> {
    return this.request("GET", `/templates/${encodeURIComponent(id)}`);
  }
  templateTags(id: string): Promise<TemplateTag[]> {
    return this.request("GET", `/templates/${encodeURIComponent(id)}/tags`);
  }
  addTags(target: string, tags: string[]): Promise<unknown> {
    return this.request("POST", "/templates/tags", { target, tags });
  }
  removeTags(name: string, tags: string[]): Promise<void> {
    return this.request("DELETE", "/templates/tags", { name, tags });
  }
  deleteTemplate(id: string): Promise<void> {
    return this.request("DELETE", `/templates/${encodeURIComponent(id)}`);
  }
  buildLogs(templateID: string, buildID: string, cursor: number): Promise<{ logs: BuildLogEntry[] }> {
    const path = `/templates/${encodeURIComponent(templateID)}/builds/${encodeURIComponent(buildID)}/logs`;
    return this.request("GET", `${path}?cursor=${cursor}&limit=1000`);
  }

  /** The team's exec policy; null when it has none. */
  async execPolicy(): Promise<ExecPolicy | null> {
    return (await this.request<{ policy: ExecPolicy | null }>("GET", "/warren/v1/exec-policy")).policy;
  }
  /** Replaces the policy (an approver key): the api validates it (400 naming the field) and answers it back. */
  async setExecPolicy(policy: unknown): Promise<ExecPolicy> {
    return (await this.request<{ policy: ExecPolicy }>("PUT", "/warren/v1/exec-policy", policy)).policy;
  }
  clearExecPolicy(): Promise<void> {
    return this.request("DELETE", "/warren/v1/exec-policy");
  }
  /** Newest first; `pending` lists only those still in time. */
  approvals(query: { state?: ApprovalState; limit: number }): Promise<ExecApproval[]> {
    const state = query.state ? `&state=${query.state}` : "";
    return this.request("GET", `/warren/v1/exec-approvals?limit=${query.limit}${state}`);
  }
  decide(approvalID: string, verdict: "approve" | "reject", reason: string): Promise<ExecApproval> {
    const body = reason ? { reason } : {};
    return this.request("POST", `/warren/v1/exec-approvals/${encodeURIComponent(approvalID)}/${verdict}`, body);
  }
  /** Undefined when the signed-in key is an approver (`GET /warren/v1/me`), else why it cannot decide. */
  async notApproverReason(): Promise<string | undefined> {
    const me = await this.request<{ approver: boolean }>("GET", "/warren/v1/me");
    return me.approver
      ? undefined
      : "deciding and changing the exec policy needs an approver API key (this key is not one)";
  }

  nodes(): Promise<ClusterNode[]> {
    return this.request("GET", "/warren/v1/admin/nodes");
  }
  cordon(nodeID: string, cordoned: boolean): Promise<void> {
    return this.request(cordoned ? "POST" : "DELETE", `/warren/v1/admin/nodes/${encodeURIComponent(nodeID)}/cordon`);
  }
  teams(): Promise<Team[]> {
    return this.request("GET", "/warren/v1/admin/teams");
  }
  createTeam(name: string): Promise<{ team: Team; apiKey: CreatedKey }> {
    return this.request("POST", "/warren/v1/admin/teams", { name });
  }
  updateTeam(id: string, limits: Partial<Omit<Team, "id" | "name">>): Promise<Team> {
    return this.request("PATCH", `/warren/v1/admin/teams/${encodeURIComponent(id)}`, limits);
  }
  createKey(teamID: string, name: string): Promise<CreatedKey> {
    return this.request("POST", `/warren/v1/admin/teams/${encodeURIComponent(teamID)}/api-keys`, { name });
  }
  listKeys(teamID: string): Promise<ApiKeyInfo[]> {
    return this.request("GET", `/warren/v1/admin/teams/${encodeURIComponent(teamID)}/api-keys`);
  }
  revokeKey(keyID: string): Promise<void> {
    return this.request("DELETE", `/warren/v1/admin/api-keys/${encodeURIComponent(keyID)}`);
  }
}
