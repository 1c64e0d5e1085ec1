/**
 * Test harness for the api and master: a private PostgreSQL schema and Redis key prefix per test file, a master
 * and an api on ephemeral ports, and in-process fake node agents behind NodeAgentClient.
 */
import { randomBytes } from "node:crypto";
import { NODE_TTL_SECONDS, NODES_SET_KEY, nodeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import pg from "pg";
import type { ApiConfig } from "../src/api/config.js";
import { ApiServer } from "../src/api/server.js";
import type { MasterConfig } from "../src/master/config.js";
import { silentLogger } from "../src/master/log.js";
import {
  type CreateOnNodeRequest,
  type NodeAgentClient,
  NodeAgentError,
  type ResumeOnNodeRequest,
  type SandboxLogLine,
  type SandboxOnNode,
  type SandboxPlacement,
  type SandboxStats,
  type SnapshotOnNode,
  type Transferred,
} from "../src/master/node-agent-client.js";
import { Master } from "../src/master/server.js";
import type { EgressPolicy } from "../src/runtime/egress/policy.js";
import { createDb, type Db } from "../src/store/db.js";
import { migrate } from "../src/store/migrations.js";
import { createApiKey, createTeam, type TeamLimits } from "../src/store/teams.js";
import { expectDocumentedAnswer } from "./api-contract.js";

export const DATABASE_URL = process.env.WARREN_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
export const REDIS_URL = process.env.WARREN_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";

/** An in-process node agent: keeps sandboxes in a map; can refuse, lose sandboxes, or hold creates. */
export class FakeNodeAgent implements NodeAgentClient {
  readonly sandboxes = new Map<string, { exec: string; state: "running" | "paused"; request: CreateOnNodeRequest }>();
  readonly created: CreateOnNodeRequest[] = [];
  readonly killed: string[] = [];
  refuse = false;
  private execCounter = 0;

  constructor(readonly nodeId: string) {}

  async create(request: CreateOnNodeRequest): Promise<SandboxPlacement> {
    if (this.refuse) throw new NodeAgentError("refused", `${this.nodeId} is full`);
    if (request.snapshotId && !this.snapshots.has(request.snapshotId)) {
      throw new NodeAgentError("refused", `snapshot ${request.snapshotId} is not on ${this.nodeId}`);
    }
    this.created.push(request);
    const exec = `${this.nodeId}-exec-${++this.execCounter}`;
    this.sandboxes.set(request.sandboxId, { exec, state: "running", request });
    return { exec, sandboxAddr: "10.0.0.2", envdUrl: "http://10.0.0.2:49983", envdVersion: "0.6.4" };
  }

  async kill(sandboxId: string): Promise<void> {
    if (!this.sandboxes.delete(sandboxId)) throw new NodeAgentError("not_found", `no sandbox ${sandboxId}`);
    this.killed.push(sandboxId);
  }

  async list(): Promise<SandboxOnNode[]> {
    return [...this.sandboxes].map(([sandboxId, s]) => ({ sandboxId, exec: s.exec, state: s.state }));
  }

  /** Fixed figures, so tests can check how the api maps them. */
  async stats(sandboxId: string): Promise<SandboxStats> {
    if (!this.sandboxes.has(sandboxId)) throw new NodeAgentError("not_found", `no sandbox ${sandboxId}`);
    return {
      memoryUsageBytes: 10 * 2 ** 20,
      memoryLimitBytes: 512 * 2 ** 20,
      cpuUsageUsec: 0,
      diskUsageBytes: 2 ** 20,
      diskLimitBytes: 2 ** 30,
    };
  }

  async pause(sandboxId: string): Promise<void> {
    const sandbox = this.sandboxes.get(sandboxId);
    if (!sandbox) throw new NodeAgentError("not_found", `no sandbox ${sandboxId}`);
    sandbox.state = "paused";
  }

  async resume(request: ResumeOnNodeRequest): Promise<SandboxPlacement> {
    const sandbox = this.sandboxes.get(request.sandboxId);
    if (!sandbox) throw new NodeAgentError("not_found", `no sandbox ${request.sandboxId}`);
    sandbox.state = "running";
    sandbox.exec = `${this.nodeId}-exec-${++this.execCounter}`;
    return { exec: sandbox.exec, sandboxAddr: "10.0.0.2", envdUrl: "http://10.0.0.2:49983" };
  }

  /** Log lines the node reports per sandbox (tests set them). */
  readonly logLines = new Map<string, SandboxLogLine[]>();

  async logs(sandboxId: string, limit: number): Promise<SandboxLogLine[]> {
    if (!this.sandboxes.has(sandboxId)) throw new NodeAgentError("not_found", `no sandbox ${sandboxId}`);
    return (this.logLines.get(sandboxId) ?? []).slice(-limit);
  }

  /** Egress policies the node was told to apply, by sandbox (create's, then each update's). */
  readonly egress = new Map<string, EgressPolicy[]>();
  failEgressUpdates = false;

  async updateEgress(sandboxId: string, egress: EgressPolicy): Promise<void> {
    if (!this.sandboxes.has(sandboxId)) throw new NodeAgentError("not_found", `no sandbox ${sandboxId}`);
    if (this.failEgressUpdates) throw new NodeAgentError("failed", "firewall update failed");
    this.egress.set(sandboxId, [...(this.egress.get(sandboxId) ?? []), egress]);
  }

  /** Snapshots on this node; `snapshotsKeepMemory` plays a driver that keeps memory (a microvm node). */
  readonly snapshots = new Map<string, SnapshotOnNode & { sourceSandboxId: string }>();
  readonly deletedSnapshots: string[] = [];
  snapshotsKeepMemory = false;
  failSnapshots = false;

  async snapshot(sandboxId: string, snapshotId: string): Promise<SnapshotOnNode> {
    const sandbox = this.sandboxes.get(sandboxId);
    if (!sandbox) throw new NodeAgentError("not_found", `no sandbox ${sandboxId}`);
    if (this.failSnapshots) throw new NodeAgentError("failed", "copying the writable layer failed");
    const made = {
      snapshotId,
      templateId: sandbox.request.templateId,
      driver: this.snapshotsKeepMemory ? "microvm" : "namespace",
      memory: this.snapshotsKeepMemory,
      sizeBytes: 4096,
      createdAt: new Date(),
    };
    this.snapshots.set(snapshotId, { ...made, sourceSandboxId: sandboxId });
    return made;
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    if (this.snapshots.delete(snapshotId)) this.deletedSnapshots.push(snapshotId);
  }

  async listSnapshots(): Promise<SnapshotOnNode[]> {
    return [...this.snapshots.values()];
  }

  /** Where imports come from: the test's other fake nodes, by the address their heartbeat gives. */
  peers: (addr: string, snapshotId: string) => FakeNodeAgent | undefined = () => undefined;
  failImports = false;

  async importSnapshot(snapshotId: string, sourceAddr: string): Promise<SnapshotOnNode & Transferred> {
    if (this.failImports) throw new NodeAgentError("failed", "disk full while unpacking");
    const made = this.peers(sourceAddr, snapshotId)?.snapshots.get(snapshotId);
    if (!made) throw new NodeAgentError("not_found", `no snapshot ${snapshotId} at ${sourceAddr}`);
    this.snapshots.set(snapshotId, { ...made });
    return { ...made, transferredBytes: made.sizeBytes };
  }
}

export interface HeartbeatFields {
  memoryTotalBytes?: number;
  pools?: Record<string, number>;
  templates?: string[];
  driver?: string;
  /** Templates the node says its driver may run (absent: every template). */
  servable?: string[];
}

export class TestEnv {
  readonly schema = `t_${randomBytes(6).toString("hex")}`;
  readonly redisPrefix = `wt-${randomBytes(6).toString("hex")}:`;
  readonly tokenSecret = randomBytes(24).toString("hex");
  readonly adminToken = randomBytes(24).toString("hex");
  readonly nodes = new Map<string, FakeNodeAgent>();
  readonly redis = new Redis(REDIS_URL, { keyPrefix: this.redisPrefix, maxRetriesPerRequest: 3 });
  readonly db: Db = createDb({ url: DATABASE_URL, schema: this.schema, max: 4 });
  readonly masters: Master[] = [];
  api!: ApiServer;
  /**
   * Whether `request` checks every answer against the OpenAPI document (api-contract.ts); the api's own tests
   * turn it on, so a route whose answer drifts from the document fails them.
   */
  checkAnswersAgainstDocument = false;

  masterConfig(overrides: Partial<MasterConfig> = {}): MasterConfig {
    return {
      port: 0,
      host: "127.0.0.1",
      databaseUrl: DATABASE_URL,
      schema: this.schema,
      redisUrl: REDIS_URL,
      redisKeyPrefix: this.redisPrefix,
      tokenSecret: this.tokenSecret,
      domain: "",
      evictIntervalMs: 100,
      // No periodic samples: tests see exactly the samples their requests take.
      metricsIntervalMs: 0,
      reconcileIntervalMs: 100,
      durabilityIntervalMs: 100,
      storeGcIntervalMs: 60_000,
      storeLayerGraceMs: 3_600_000,
      leaderIntervalMs: 100,
      placementAttempts: 3,
      synchronousCommit: "off",
      startTimeoutMs: 120_000,
      nodeDownAfterMs: 300,
      memoryOvercommit: 1,
      ...overrides,
    };
  }

  async startMaster(overrides: Partial<MasterConfig> = {}): Promise<Master> {
    const master = await Master.start({
      config: this.masterConfig(overrides),
      nodeAgent: (nodeId) => {
        const node = this.nodes.get(nodeId);
        if (!node) throw new NodeAgentError("unavailable", `unknown node ${nodeId}`);
        return node;
      },
      log: silentLogger,
    });
    this.masters.push(master);
    return master;
  }

  /** Starts a master and an api; `api` overrides the api's config (volumes, secrets, ...). */
  async start(overrides: Partial<MasterConfig> = {}, api: Partial<ApiConfig> = {}): Promise<this> {
    const master = await this.startMaster(overrides);
    this.api = await ApiServer.start({
      config: {
        port: 0,
        host: "127.0.0.1",
        databaseUrl: DATABASE_URL,
        schema: this.schema,
        masterUrl: master.url,
        adminToken: this.adminToken,
        // The default's: a known key's identity is kept (and forgotten on a change of a team or key).
        apiKeyCacheMs: 60_000,
        ...api,
      } as ApiConfig,
      log: silentLogger,
      ssePollMs: 50,
    });
    return this;
  }

  /** Registers a fake node and writes its heartbeat as a node agent would. */
  async addNode(nodeId: string, fields: HeartbeatFields = {}): Promise<FakeNodeAgent> {
    const node = this.nodes.get(nodeId) ?? new FakeNodeAgent(nodeId);
    this.nodes.set(nodeId, node);
    // Fake addresses are not unique (they encode the id's length): the peer is the one at it with the snapshot.
    node.peers = (addr, snapshotId) =>
      [...this.nodes.entries()].find(
        ([id, peer]) => addr === `127.0.0.1:${id.length + 7000}` && peer !== node && peer.snapshots.has(snapshotId),
      )?.[1];
    await this.heartbeat(nodeId, fields);
    return node;
  }

  async heartbeat(nodeId: string, fields: HeartbeatFields = {}): Promise<void> {
    await this.redis.sadd(NODES_SET_KEY, nodeId);
    await this.redis.hset(nodeKey(nodeId), {
      nodeId,
      addr: `127.0.0.1:${nodeId.length + 7000}`,
      driver: fields.driver ?? "fake",
      cpuCount: "8",
      memoryTotalBytes: String(fields.memoryTotalBytes ?? 64 * 1024 ** 3),
      memoryFreeBytes: String(fields.memoryTotalBytes ?? 64 * 1024 ** 3),
      sandboxes: "0",
      pools: JSON.stringify(fields.pools ?? {}),
      templates: JSON.stringify(fields.templates ?? ["base"]),
      ...(fields.servable ? { servable: JSON.stringify(fields.servable) } : {}),
      updatedAt: String(Date.now()),
    });
    await this.redis.expire(nodeKey(nodeId), NODE_TTL_SECONDS);
  }

  /** The node's heartbeat key expires (agent died). */
  async stopHeartbeat(nodeId: string): Promise<void> {
    await this.redis.del(nodeKey(nodeId));
  }

  async team(name = "team", limits: TeamLimits = {}): Promise<{ teamId: string; apiKey: string }> {
    await migrate(this.db, this.schema);
    const team = await createTeam(this.db, name, limits);
    const key = await createApiKey(this.db, team.id);
    return { teamId: team.id, apiKey: key.key };
  }

  async request(
    method: string,
    path: string,
    options: { apiKey?: string; body?: unknown; headers?: Record<string, string> } = {},
  ): Promise<{ status: number; headers: Headers; body: unknown; text: string }> {
    const headers: Record<string, string> = { ...(options.headers ?? {}) };
    if (options.apiKey) headers["X-API-KEY"] = options.apiKey;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(`${this.api.url}${path}`, {
      method,
      headers,
      ...(options.body !== undefined
        ? { body: typeof options.body === "string" ? options.body : JSON.stringify(options.body) }
        : {}),
    });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      // not JSON
    }
    const answer = { status: res.status, headers: res.headers, body, text };
    if (this.checkAnswersAgainstDocument) expectDocumentedAnswer(method, path, answer);
    return answer;
  }

  async stop(): Promise<void> {
    await this.api?.stop();
    for (const master of this.masters) await master.stop();
    const plain = new Redis(REDIS_URL);
    const keys = await plain.keys(`${this.redisPrefix}*`);
    if (keys.length > 0) await plain.del(...keys);
    plain.disconnect();
    this.redis.disconnect();
    await this.db.end();
    await dropSchema(this.schema);
  }
}

/** Removes a test's PostgreSQL schema and everything in it. */
export async function dropSchema(schema: string): Promise<void> {
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await admin.end();
}

/** A PostgreSQL schema of a test file's own (migrate it first); `drop` ends the pool and removes the schema. */
export function testSchema(max = 2): { schema: string; db: Db; drop: () => Promise<void> } {
  const schema = `t_${randomBytes(6).toString("hex")}`;
  const db = createDb({ url: DATABASE_URL, schema, max });
  return {
    schema,
    db,
    drop: async () => {
      await db.end();
      await dropSchema(schema);
    },
  };
}

/** Polls until `check` returns a value other than undefined (no wall-time assertions, only a generous cap). */
export async function eventually<T>(check: () => Promise<T | undefined>, what: string, capMs = 15_000): Promise<T> {
  const deadline = Date.now() + capMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
