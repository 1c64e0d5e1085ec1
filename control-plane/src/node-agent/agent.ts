import { randomBytes } from "node:crypto";
import { cpus, freemem, totalmem } from "node:os";
import { isSandboxId, type SandboxRoute } from "@warren/proto/redis";
import type { Instance, InstanceStats, RuntimeDriver, SandboxResources } from "../runtime/driver.js";
import type { BuiltTemplate, TemplateStore } from "../templates/store.js";
import type { NodeAgentConfig } from "./config.js";
import { initEnvd } from "./envd-client.js";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";
import type { RouteStore } from "./routes.js";
import { WarmPool } from "./warm-pool.js";

export interface CreateSandboxInput {
  readonly sandboxId: string;
  readonly teamId: string;
  readonly templateId: string;
  /** Zero or absent fields take the template's defaults. */
  readonly resources?: Partial<Pick<SandboxResources, "cpuCount" | "memoryMiB" | "diskMiB">>;
  readonly envVars?: Readonly<Record<string, string>>;
  readonly envdAccessToken?: string;
  readonly trafficTokenHash?: string;
  readonly publicTraffic?: boolean;
  readonly autoResume?: boolean;
  readonly metadata?: Readonly<Record<string, string>>;
  readonly defaultUser?: string;
  readonly defaultWorkdir?: string;
  /** Replaces the sandbox's start command (tests of failing starts only; never pooled). */
  readonly command?: readonly string[];
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

export interface NodeInfo {
  readonly nodeId: string;
  readonly addr: string;
  readonly driver: string;
  readonly cpuCount: number;
  readonly memoryTotalBytes: number;
  readonly memoryFreeBytes: number;
  readonly sandboxes: number;
  readonly pools: Readonly<Record<string, number>>;
  readonly templates: readonly string[];
}

/** Limits on what a create may ask for; beyond them a request is refused as absurd. */
export const RESOURCE_LIMITS = {
  cpuCount: { min: 0.05, max: 64 },
  memoryMiB: { min: 64, max: 256 * 1024 },
  diskMiB: { min: 64, max: 1024 * 1024 },
} as const;

/**
 * The node agent: sandboxes by id on top of a runtime driver. Create takes a warm sandbox (or starts one),
 * initialises envd, records the binding with the instance (so it survives an agent crash), and writes the route;
 * kill deletes the route first, then the instance. Heartbeats publish capacity for the master's scheduler.
 */
export class NodeAgent {
  private readonly sandboxes = new Map<string, SandboxSummary>();
  private readonly creating = new Set<string>();
  private readonly pools = new Map<string, WarmPool>();
  private readonly builds = new Map<string, Promise<BuiltTemplate>>();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private generationCounter = 0;
  private draining = false;

  constructor(
    private readonly config: NodeAgentConfig,
    private readonly driver: RuntimeDriver,
    private readonly templates: TemplateStore,
    private readonly routes: RouteStore,
    private readonly log: Logger,
  ) {}

  /** Re-adopts or removes what a previous agent left, then starts heartbeats, template builds and pools. */
  async start(): Promise<void> {
    await this.routes.connect();
    await this.driver.start();
    await this.reconcile();
    await this.heartbeat();
    this.heartbeatTimer = setInterval(() => void this.heartbeat(), this.config.heartbeatMs);
    this.heartbeatTimer.unref();
    for (const id of this.config.prebuildTemplates) {
      this.ensureTemplate(id).catch((error) => this.log.error("template build failed", { templateId: id, error }));
    }
  }

  /** Builds the template unless cached (once per agent), then starts its warm pool when it has one. */
  ensureTemplate(templateId: string): Promise<BuiltTemplate> {
    let build = this.builds.get(templateId);
    if (!build) {
      build = this.templates
        .ensure(templateId, async (image) => {
          const instance = await this.driver.create({
            template: image,
            resources: this.templates.recipe(image.templateId).defaults,
          });
          await this.driver.kill(instance.instanceId);
        })
        .then((template) => {
          this.startPool(template);
          return template;
        });
      build.catch(() => this.builds.delete(templateId));
      this.builds.set(templateId, build);
    }
    return build;
  }

  private startPool(template: BuiltTemplate): void {
    if (this.draining || this.pools.has(template.templateId)) return;
    if (!this.config.poolTemplates.includes(template.templateId) || this.config.poolSize === 0) return;
    const pool = new WarmPool(
      template.templateId,
      this.config.poolSize,
      () => this.driver.create({ template, resources: template.recipe.defaults, labels: { pooled: "1" } }),
      (instance) => this.driver.kill(instance.instanceId),
      this.log,
    );
    this.pools.set(template.templateId, pool);
    pool.refill();
  }

  /** The warm pool of a template, once it exists (tests and benchmarks wait on `filled()`). */
  pool(templateId: string): WarmPool | undefined {
    return this.pools.get(templateId);
  }

  async create(input: CreateSandboxInput): Promise<SandboxPlacement> {
    if (this.draining) throw new AgentError("unavailable", "node agent is shutting down");
    if (!isSandboxId(input.sandboxId)) {
      throw new AgentError(
        "invalid_argument",
        `invalid sandbox id '${input.sandboxId}' (lowercase letters and digits, at most 63)`,
      );
    }
    if (!this.templates.knows(input.templateId)) {
      throw new AgentError(
        "not_found",
        `unknown template '${input.templateId}' (this node has: ${this.templates.ids().join(", ")})`,
      );
    }
    if (this.sandboxes.has(input.sandboxId) || this.creating.has(input.sandboxId)) {
      throw new AgentError("already_exists", `sandbox '${input.sandboxId}' already exists on this node`);
    }
    if (this.sandboxes.size + this.creating.size >= this.config.maxSandboxes) {
      throw new AgentError("resource_exhausted", `node is full (${this.config.maxSandboxes} sandboxes)`);
    }
    const template = this.templates.ready(input.templateId);
    if (!template) {
      this.ensureTemplate(input.templateId).catch(() => undefined);
      throw new AgentError("unavailable", `template '${input.templateId}' is being built on this node; retry later`);
    }
    const resources = this.resolveResources(template, input.resources);
    this.creating.add(input.sandboxId);
    const log = this.log.child({ sandboxId: input.sandboxId, templateId: input.templateId });
    try {
      const defaults = template.recipe.defaults;
      const poolable =
        !input.command &&
        resources.cpuCount === defaults.cpuCount &&
        resources.memoryMiB === defaults.memoryMiB &&
        resources.diskMiB === defaults.diskMiB;
      let instance = poolable ? this.pools.get(input.templateId)?.take() : undefined;
      const pooled = instance !== undefined;
      if (!instance) {
        try {
          instance = await this.driver.create({
            template,
            resources,
            ...(input.command ? { command: input.command } : {}),
          });
        } catch (error) {
          throw new AgentError("internal", `sandbox '${input.sandboxId}' failed to start: ${(error as Error).message}`);
        }
      }
      const exec = randomBytes(8).toString("hex");
      const generation = Date.now() * 1000 + (this.generationCounter++ % 1000);
      let routeWritten = false;
      try {
        const envdVersion = await initEnvd(instance.envdUrl, {
          envVars: input.envVars ?? {},
          accessToken: input.envdAccessToken ?? "",
          defaultUser: input.defaultUser || "user",
          defaultWorkdir: input.defaultWorkdir || "/home/user",
        });
        const labels = {
          pooled: "",
          sandboxId: input.sandboxId,
          exec,
          generation: String(generation),
          teamId: input.teamId,
          publicTraffic: input.publicTraffic ? "1" : "0",
          trafficTokenHash: input.trafficTokenHash ?? "",
          autoResume: input.autoResume ? "1" : "0",
          metadata: JSON.stringify(input.metadata ?? {}),
        };
        instance = await this.driver.label(instance.instanceId, labels);
        const summary = this.summaryOf(instance);
        if (!summary) throw new Error("instance lost its labels");
        routeWritten = await this.routes.write(this.routeOf(summary));
        if (!routeWritten) throw new Error("Redis holds a newer route for this sandbox id");
        this.sandboxes.set(input.sandboxId, summary);
        log.info("sandbox created", { exec, pooled, addr: instance.addr, instanceId: instance.instanceId });
        return {
          sandboxId: input.sandboxId,
          exec,
          generation,
          sandboxAddr: instance.addr,
          envdUrl: instance.envdUrl,
          envdVersion,
          pooled,
        };
      } catch (error) {
        log.warn("create failed after start; removing the sandbox", { error });
        if (routeWritten) await this.routes.delete(input.sandboxId, exec, generation).catch(() => undefined);
        await this.driver.kill(instance.instanceId).catch((e) => log.error("cleanup failed", { error: e }));
        throw error instanceof AgentError
          ? error
          : new AgentError("internal", `create failed: ${(error as Error).message}`);
      }
    } finally {
      this.creating.delete(input.sandboxId);
    }
  }

  private resolveResources(template: BuiltTemplate, asked: CreateSandboxInput["resources"]): SandboxResources {
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
      memoryMiB: Math.round(pick("memoryMiB", asked?.memoryMiB, defaults.memoryMiB)),
      diskMiB: Math.round(pick("diskMiB", asked?.diskMiB, defaults.diskMiB)),
      pidsMax: defaults.pidsMax,
    };
  }

  /** Deletes the route first (the proxy stops sending traffic), then removes the sandbox entirely. */
  async kill(sandboxId: string, exec?: string): Promise<void> {
    const sandbox = this.sandboxes.get(sandboxId);
    if (!sandbox || (exec && exec !== sandbox.exec)) {
      throw new AgentError(
        "not_found",
        `sandbox '${sandboxId}'${exec ? ` with exec '${exec}'` : ""} is not on this node`,
      );
    }
    this.sandboxes.delete(sandboxId);
    await this.routes.delete(sandboxId, sandbox.exec, sandbox.generation);
    await this.driver.kill(sandbox.instanceId);
    this.log.info("sandbox killed", { sandboxId, exec: sandbox.exec });
  }

  list(): SandboxSummary[] {
    return [...this.sandboxes.values()];
  }

  get(sandboxId: string): SandboxSummary | undefined {
    return this.sandboxes.get(sandboxId);
  }

  async stats(sandboxId: string): Promise<InstanceStats> {
    const sandbox = this.sandboxes.get(sandboxId);
    if (!sandbox) throw new AgentError("not_found", `sandbox '${sandboxId}' is not on this node`);
    return this.driver.stats(sandbox.instanceId);
  }

  info(): NodeInfo {
    const pools: Record<string, number> = {};
    for (const [id, pool] of this.pools) pools[id] = pool.readyCount;
    return {
      nodeId: this.config.nodeId,
      addr: this.config.nodeAddr,
      driver: this.driver.name,
      cpuCount: cpus().length,
      memoryTotalBytes: totalmem(),
      memoryFreeBytes: freemem(),
      sandboxes: this.sandboxes.size,
      pools,
      templates: this.templates.ids().filter((id) => this.templates.ready(id)),
    };
  }

  /**
   * Stops accepting creates, stops heartbeats and pools (pooled sandboxes are removed) and leaves claimed
   * sandboxes running: a restarted agent re-adopts them. `killAll` removes them too.
   */
  async close(options: { killAll?: boolean } = {}): Promise<void> {
    this.draining = true;
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    for (const pool of this.pools.values()) await pool.close();
    if (options.killAll) {
      for (const id of [...this.sandboxes.keys()])
        await this.kill(id).catch((error) => this.log.error("kill failed", { sandboxId: id, error }));
      await this.routes.removeNode(this.config.nodeId).catch(() => undefined);
    }
    await this.driver.close();
    await this.routes.close();
  }

  private async heartbeat(): Promise<void> {
    try {
      const info = this.info();
      const known = await this.routes.heartbeat({ ...info, updatedAt: Date.now() });
      // Redis lost our key (restarted without persistence): it lost our routes too. Writes are
      // compare-and-set by generation, so republishing can never clobber a newer incarnation.
      if (!known) for (const summary of this.sandboxes.values()) await this.routes.write(this.routeOf(summary));
    } catch (error) {
      this.log.warn("heartbeat failed", { error });
    }
  }

  private async reconcile(): Promise<void> {
    const { adopted, removed } = await this.driver.reconcile();
    let pooledRemoved = 0;
    for (const instance of adopted) {
      const summary = this.summaryOf(instance);
      if (!summary || !isSandboxId(summary.sandboxId)) {
        // A warm sandbox of the previous agent (never initialised, cheaper to replace than to track), or one whose
        // id the route contract no longer accepts.
        await this.driver.kill(instance.instanceId);
        pooledRemoved++;
        continue;
      }
      this.sandboxes.set(summary.sandboxId, summary);
      const route = await this.routes.read(summary.sandboxId);
      if (!route || route.exec === summary.exec) await this.routes.write(this.routeOf(summary));
    }
    for (const { labels } of removed) {
      if (labels.sandboxId && labels.exec && isSandboxId(labels.sandboxId)) {
        await this.routes.delete(labels.sandboxId, labels.exec, Number(labels.generation ?? 0));
      }
    }
    for (const route of await this.routes.routesOfNode(this.config.nodeId)) {
      if (!isSandboxId(route.sandboxId)) {
        this.log.warn("route with an id the contract rejects left in Redis", { sandboxId: route.sandboxId });
      } else if (this.sandboxes.get(route.sandboxId)?.exec !== route.exec) {
        await this.routes.delete(route.sandboxId, route.exec, route.generation);
      }
    }
    this.log.info("reconciled sandboxes after start", {
      adopted: this.sandboxes.size,
      removed: removed.map((r) => r.labels.sandboxId || r.instanceId),
      pooledRemoved,
    });
  }

  private summaryOf(instance: Instance): SandboxSummary | undefined {
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

  private routeOf(summary: SandboxSummary): SandboxRoute {
    const labels = this.driver.list().find((i) => i.instanceId === summary.instanceId)?.labels ?? {};
    return {
      sandboxId: summary.sandboxId,
      exec: summary.exec,
      generation: summary.generation,
      node: this.config.nodeId,
      nodeAddr: this.config.nodeAddr,
      sandboxAddr: summary.sandboxAddr,
      ports: {},
      state: "running",
      team: summary.teamId,
      public: labels.publicTraffic === "1",
      trafficTokenHash: labels.trafficTokenHash ?? "",
      autoResume: labels.autoResume === "1",
      maskRequestHost: "",
    };
  }
}
