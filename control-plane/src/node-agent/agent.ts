import { randomBytes } from "node:crypto";
import { cpus, freemem, totalmem } from "node:os";
import { isSandboxId, isSnapshotId, type SandboxRoute } from "@warren/proto/redis";
import type { Instance, InstanceStats, RuntimeDriver, SandboxResources, SnapshotImage } from "../runtime/driver.js";
import {
  CLOSED_EGRESS,
  compileEgress,
  type EgressPolicy,
  EgressPolicyError,
  OPEN_EGRESS,
} from "../runtime/egress/policy.js";
import { driverServes } from "../templates/catalog.js";
import type { BuiltTemplate, TemplateStore } from "../templates/store.js";
import type { NodeAgentConfig } from "./config.js";
import { initEnvd } from "./envd-client.js";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";
import type { RouteStore } from "./routes.js";
import { parseSandboxLog, type SandboxLogLine } from "./sandbox-log.js";
import { StartGate } from "./start-gate.js";
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
  /** Egress policy (E2B allowOut/denyOut, internet access folded in by the master); default: nothing leaves. */
  readonly egress?: EgressPolicy;
  /** Start from this snapshot on this node (`templateId` must be its template). */
  readonly snapshotId?: string;
  /** The access token envd holds in a memory snapshot (its source's), presented to /init to set the new one. */
  readonly snapshotEnvdAccessToken?: string;
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
  /** Templates this node's driver may run (built or not). */
  readonly servable: readonly string[];
}

/** A failed checkpoint is tried again this much later (at the earliest). */
const CHECKPOINT_RETRY_MS = 5_000;

function round(value: number): number {
  return Math.round(value * 10) / 10;
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
  /** Per-sandbox queue of pause/resume/checkpoint/kill, so they never interleave. */
  private readonly locks = new Map<string, Promise<void>>();
  private readonly checkpointTimers = new Map<string, NodeJS.Timeout>();
  private readonly pools = new Map<string, WarmPool>();
  /** Cold starts run at most `maxConcurrentStarts` at once (claims from a warm pool never wait). */
  private readonly startGate: StartGate;
  private readonly builds = new Map<string, Promise<BuiltTemplate>>();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private generationCounter = 0;
  private draining = false;
  private started = false;

  /** False until start() has re-adopted what a previous agent left: until then requests are refused. */
  get ready(): boolean {
    return this.started;
  }

  constructor(
    private readonly config: NodeAgentConfig,
    private readonly driver: RuntimeDriver,
    private readonly templates: TemplateStore,
    private readonly routes: RouteStore,
    private readonly log: Logger,
  ) {
    // Tests build configs by hand; an absent limit is the loader's default.
    this.startGate = new StartGate(config.maxConcurrentStarts || Math.max(2, cpus().length * 2));
  }

  /** Re-adopts or removes what a previous agent left, then starts heartbeats, template builds and pools. */
  async start(): Promise<void> {
    // A Redis blip while connecting or re-adopting (a restart of Redis) must not kill the agent and strand its
    // sandboxes: each step is idempotent, so they are simply run again.
    for (let attempt = 1; ; attempt++) {
      try {
        await this.routes.connect();
        await this.driver.start();
        await this.reconcile();
        break;
      } catch (error) {
        if (attempt >= 10) throw error;
        this.log.warn("re-adopting sandboxes failed; retrying", { attempt, error: (error as Error).message });
        await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
      }
    }
    this.started = true;
    await this.heartbeat();
    this.heartbeatTimer = setInterval(() => void this.heartbeat(), this.config.heartbeatMs);
    this.heartbeatTimer.unref();
    // Back from a Redis outage (a restart loses every key): beat and republish at once, not a period later,
    // so the master does not see the node as gone meanwhile.
    this.routes.onReady(() => {
      if (!this.draining) void this.heartbeat();
    });
    for (const id of this.config.prebuildTemplates) {
      this.ensureTemplate(id).catch((error) => this.log.error("template build failed", { templateId: id, error }));
    }
  }

  /** Builds the template unless cached (once per agent), then starts its warm pool when it has one. */
  ensureTemplate(templateId: string): Promise<BuiltTemplate> {
    const recipe = this.templates.knows(templateId) ? this.templates.recipe(templateId) : undefined;
    if (recipe && !driverServes(recipe, this.driver.name)) {
      // Never built here (WARREN_PREBUILD_TEMPLATES or a pool naming it): no sandbox of it could run.
      return Promise.reject(
        new AgentError("failed_precondition", `template '${templateId}' cannot run on the ${this.driver.name} driver`),
      );
    }
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
      // Pooled sandboxes get E2B's default policy (internet on) up front, so most claims change nothing.
      () =>
        this.driver.create({
          template,
          resources: template.recipe.defaults,
          labels: { pooled: "1" },
          ...(this.driver.setEgress ? { egress: OPEN_EGRESS } : {}),
        }),
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
    const required = this.templates.recipe(input.templateId).requiresDriver;
    if (required && !driverServes(this.templates.recipe(input.templateId), this.driver.name)) {
      throw new AgentError(
        "failed_precondition",
        `template '${input.templateId}' runs only on ${required} nodes; this node's driver is ${this.driver.name}`,
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
    const snapshot = input.snapshotId ? await this.findSnapshot(input.snapshotId, input.templateId) : undefined;
    // A memory snapshot's processes run in the memory they had: the snapshot's resources, not the request's.
    const resources = snapshot?.memory ? snapshot.resources : this.resolveResources(template, input.resources);
    const egress = this.checkEgress(input.egress ?? CLOSED_EGRESS);
    this.creating.add(input.sandboxId);
    const log = this.log.child({ sandboxId: input.sandboxId, templateId: input.templateId });
    try {
      const defaults = template.recipe.defaults;
      const poolable =
        !input.command &&
        !snapshot &&
        resources.cpuCount === defaults.cpuCount &&
        resources.memoryMiB === defaults.memoryMiB &&
        resources.diskMiB === defaults.diskMiB;
      let instance = poolable ? this.pools.get(input.templateId)?.take() : undefined;
      const pooled = instance !== undefined;
      if (!instance) {
        try {
          instance = await this.startGate.run(() =>
            this.driver.create({
              template,
              resources,
              ...(input.command ? { command: input.command } : {}),
              ...(this.driver.setEgress ? { egress } : {}),
              ...(snapshot ? { snapshotId: snapshot.snapshotId } : {}),
            }),
          );
        } catch (error) {
          throw new AgentError("internal", `sandbox '${input.sandboxId}' failed to start: ${(error as Error).message}`);
        }
      }
      const previousToken = snapshot?.memory ? input.snapshotEnvdAccessToken : undefined;
      return await this.activate(instance, input, egress, pooled, log, previousToken);
    } finally {
      this.creating.delete(input.sandboxId);
    }
  }

  private async findSnapshot(snapshotId: string, templateId: string): Promise<SnapshotImage> {
    const snapshot = (await this.driver.listSnapshots()).find((s) => s.snapshotId === snapshotId);
    if (!snapshot) throw new AgentError("not_found", `snapshot '${snapshotId}' is not on this node`);
    if (snapshot.templateId !== templateId) {
      throw new AgentError(
        "invalid_argument",
        `snapshot '${snapshotId}' is of template '${snapshot.templateId}', not '${templateId}'`,
      );
    }
    return snapshot;
  }

  /**
   * Captures a sandbox as a snapshot on this node (files; processes and memory where the driver keeps them). It
   * waits for any pause/resume/checkpoint of the sandbox, like those wait for each other; a running sandbox is
   * still for the copy only (its route stays `running`: requests wait, streams stay open).
   */
  async snapshot(sandboxId: string, snapshotId: string): Promise<SnapshotImage> {
    if (!isSnapshotId(snapshotId)) {
      throw new AgentError("invalid_argument", `invalid snapshot id '${snapshotId}' (a-z, 0-9, '_', '-'; at most 63)`);
    }
    return this.exclusive(sandboxId, async () => {
      const sandbox = this.requireSandbox(sandboxId);
      if ((await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId)) {
        throw new AgentError("already_exists", `snapshot '${snapshotId}' already exists on this node`);
      }
      const startedAt = performance.now();
      let image: SnapshotImage;
      try {
        image = await this.driver.snapshot(sandbox.instanceId, snapshotId);
      } catch (error) {
        throw new AgentError("internal", `snapshot of sandbox '${sandboxId}' failed: ${(error as Error).message}`);
      }
      this.log.info("sandbox snapshotted", {
        sandboxId,
        snapshotId,
        memory: image.memory,
        sizeMiB: round(image.sizeBytes / 2 ** 20),
        ms: round(performance.now() - startedAt),
      });
      return image;
    });
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    if (!isSnapshotId(snapshotId)) return;
    await this.driver.deleteSnapshot(snapshotId);
    this.log.info("snapshot deleted", { snapshotId });
  }

  listSnapshots(): Promise<SnapshotImage[]> {
    return this.driver.listSnapshots();
  }

  /** The snapshot as a byte stream for another node (ImportSnapshot there). */
  async exportSnapshot(snapshotId: string): Promise<AsyncIterable<Uint8Array>> {
    if (!this.driver.exportSnapshot) {
      throw new AgentError("unimplemented", `the ${this.driver.name} driver cannot move snapshots between nodes`);
    }
    if (!(await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId)) {
      throw new AgentError("not_found", `snapshot '${snapshotId}' is not on this node`);
    }
    return this.driver.exportSnapshot(snapshotId);
  }

  /** Stores a snapshot streamed from another node agent; on failure nothing of it is left. */
  async importSnapshot(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    if (!isSnapshotId(snapshotId)) {
      throw new AgentError("invalid_argument", `invalid snapshot id '${snapshotId}' (a-z, 0-9, '_', '-'; at most 63)`);
    }
    if (!this.driver.importSnapshot) {
      throw new AgentError("unimplemented", `the ${this.driver.name} driver cannot move snapshots between nodes`);
    }
    if ((await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId)) {
      throw new AgentError("already_exists", `snapshot '${snapshotId}' already exists on this node`);
    }
    const startedAt = performance.now();
    let image: SnapshotImage;
    try {
      image = await this.driver.importSnapshot(snapshotId, data);
    } catch (error) {
      throw new AgentError("internal", `importing snapshot '${snapshotId}' failed: ${(error as Error).message}`);
    }
    this.log.info("snapshot imported", {
      snapshotId,
      sizeMiB: round(image.sizeBytes / 2 ** 20),
      ms: round(performance.now() - startedAt),
    });
    return image;
  }

  /**
   * Makes a started instance the sandbox: envd /init (token, env vars), egress policy, labels, route. On failure
   * the instance is removed and the route deleted.
   */
  private async activate(
    started: Instance,
    input: Omit<CreateSandboxInput, "templateId">,
    egress: EgressPolicy,
    pooled: boolean,
    log: Logger,
    currentAccessToken?: string,
  ): Promise<SandboxPlacement> {
    let instance = started;
    const exec = randomBytes(8).toString("hex");
    const generation = this.nextGeneration();
    let routeWritten = false;
    try {
      const claimed = instance;
      const [envdVersion] = await Promise.all([
        initEnvd(
          claimed.envdUrl,
          {
            envVars: input.envVars ?? {},
            accessToken: input.envdAccessToken ?? "",
            defaultUser: input.defaultUser || "user",
            defaultWorkdir: input.defaultWorkdir || "/home/user",
            ...(currentAccessToken ? { currentAccessToken } : {}),
          },
          this.driver.envdInitTimeoutMs,
        ),
        this.driver.setEgress?.(claimed.instanceId, egress),
      ]);
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
  }

  /** Validates a policy and refuses ones the driver cannot enforce (it keeps egress closed). */
  private checkEgress(policy: EgressPolicy): EgressPolicy {
    let compiled: ReturnType<typeof compileEgress>;
    try {
      compiled = compileEgress(policy);
    } catch (error) {
      if (error instanceof EgressPolicyError) throw new AgentError("invalid_argument", error.message);
      throw error;
    }
    if (!this.driver.setEgress && compiled.key !== compileEgress(CLOSED_EGRESS).key) {
      throw new AgentError(
        "failed_precondition",
        `the ${this.driver.name} driver cannot open sandbox egress on this node; ask for allow_internet_access: false`,
      );
    }
    return policy;
  }

  /** The newest `limit` lines of the sandbox's own log (envd), oldest first. */
  async logs(sandboxId: string, limit: number): Promise<SandboxLogLine[]> {
    const sandbox = this.requireSandbox(sandboxId);
    if (!this.driver.logTail) return [];
    // ~250 bytes per envd line: enough bytes for `limit` lines without reading a long log whole.
    const text = await this.driver.logTail(sandbox.instanceId, Math.min(4 << 20, Math.max(64 << 10, limit * 512)));
    return parseSandboxLog(text, limit, sandbox.startedAt);
  }

  /** Replaces a sandbox's egress policy while it runs or is paused (E2B `PUT /sandboxes/{id}/network`). */
  async updateEgress(sandboxId: string, policy: EgressPolicy): Promise<void> {
    const checked = this.checkEgress(policy);
    await this.exclusive(sandboxId, async () => {
      const sandbox = this.requireSandbox(sandboxId);
      await this.driver.setEgress?.(sandbox.instanceId, checked);
      this.log.info("sandbox egress policy replaced", {
        sandboxId,
        allowOut: checked.allowOut.length,
        denyOut: checked.denyOut.length,
      });
    });
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
    clearTimeout(this.checkpointTimers.get(sandboxId));
    this.checkpointTimers.delete(sandboxId);
    return this.exclusive(sandboxId, () => this.killNow(sandboxId, exec));
  }

  private async killNow(sandboxId: string, exec?: string): Promise<void> {
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

  /**
   * Pauses a sandbox in two tiers. First the cgroup freezer (instant; memory stays resident): the route turns
   * `paused` before the freeze, same exec and generation, so proxies drop the sandbox's open streams and stop
   * sending traffic; a failed freeze puts the route back. Then, when the driver can checkpoint (CRIU) and the
   * sandbox is still paused `checkpointAfterMs` later, it is converted to a checkpoint on disk and its memory is
   * released. `memory: false` (filesystem only) ends every process right after the freeze; resume reboots.
   */
  async pause(sandboxId: string, memory: boolean): Promise<void> {
    await this.exclusive(sandboxId, async () => {
      const sandbox = this.requireSandbox(sandboxId);
      if (sandbox.paused) throw new AgentError("failed_precondition", `sandbox '${sandboxId}' is already paused`);
      const startedAt = performance.now();
      const paused: SandboxSummary = { ...sandbox, paused: true };
      await this.routes.write(this.routeOf(paused));
      try {
        await this.driver.pause(sandbox.instanceId);
      } catch (error) {
        await this.routes.write(this.routeOf(sandbox)).catch(() => undefined);
        throw new AgentError("internal", `pausing sandbox '${sandboxId}' failed: ${(error as Error).message}`);
      }
      await this.driver.label(sandbox.instanceId, { pausedMemory: memory ? "1" : "0" });
      this.sandboxes.set(sandboxId, paused);
      if (memory) this.scheduleCheckpoint(sandboxId);
      else {
        // Filesystem only: the processes end now (memory released); resume reboots over the kept disk.
        await this.driver.stop(sandbox.instanceId).catch((error) =>
          this.log.warn("stopping a filesystem-only paused sandbox failed; it stays frozen", {
            sandboxId,
            error: (error as Error).message,
          }),
        );
      }
      this.log.info("sandbox paused", {
        sandboxId,
        exec: sandbox.exec,
        tier: memory ? "freezer" : "filesystem",
        memory,
        ms: round(performance.now() - startedAt),
      });
    });
  }

  /** After `checkpointAfterMs` paused, the sandbox goes from the freezer to a checkpoint on disk. */
  private scheduleCheckpoint(sandboxId: string, delay = this.config.checkpointAfterMs): void {
    if (!this.driver.canCheckpoint || this.config.checkpointAfterMs < 0 || this.draining) return;
    clearTimeout(this.checkpointTimers.get(sandboxId));
    const timer = setTimeout(() => {
      this.checkpointTimers.delete(sandboxId);
      void this.checkpoint(sandboxId);
    }, delay);
    timer.unref();
    this.checkpointTimers.set(sandboxId, timer);
  }

  /** Converts a frozen sandbox to a checkpoint; a failure leaves it frozen (still resumable) and is logged. */
  private async checkpoint(sandboxId: string): Promise<void> {
    await this.exclusive(sandboxId, async () => {
      const sandbox = this.sandboxes.get(sandboxId);
      if (!sandbox?.paused || this.draining) return;
      const instance = this.driver.list().find((i) => i.instanceId === sandbox.instanceId);
      if (!instance || instance.checkpointed || instance.stopped) return;
      const startedAt = performance.now();
      try {
        const result = await this.driver.checkpoint(sandbox.instanceId);
        this.log.info("paused sandbox checkpointed to disk", {
          sandboxId,
          ms: round(performance.now() - startedAt),
          imageMiB: round(result.imageBytes / 2 ** 20),
          memoryBeforeMiB: round(result.memoryBeforeBytes / 2 ** 20),
          memoryAfterMiB: round(result.memoryAfterBytes / 2 ** 20),
        });
      } catch (error) {
        this.log.warn("checkpoint failed; the sandbox stays frozen in memory and is tried again later", {
          sandboxId,
          error: (error as Error).message,
        });
        this.scheduleCheckpoint(sandboxId, Math.max(this.config.checkpointAfterMs, CHECKPOINT_RETRY_MS));
      }
    }).catch((error) => this.log.warn("checkpoint skipped", { sandboxId, error: (error as Error).message }));
  }

  /**
   * Resumes a paused sandbox as a new incarnation: thaws it (freezer tier) or restores its checkpoint, gives it
   * a new exec id and a larger generation (recorded with the instance, so a restarted agent knows it), and writes
   * the route `running`; the route event tells every proxy to drop what it cached for the old incarnation.
   * Tokens are unchanged (envd keeps its /init). A failed resume leaves the sandbox paused, its checkpoint
   * intact. A sandbox already running answers with its current placement (a retried resume).
   */
  async resume(input: ResumeSandboxInput): Promise<SandboxPlacement> {
    return this.exclusive(input.sandboxId, async () => {
      const sandbox = this.requireSandbox(input.sandboxId);
      if (!sandbox.paused) return this.placementOf(sandbox);
      clearTimeout(this.checkpointTimers.get(input.sandboxId));
      this.checkpointTimers.delete(input.sandboxId);
      const startedAt = performance.now();
      const current = this.driver.list().find((i) => i.instanceId === sandbox.instanceId);
      const reboot = !input.memory || current?.stopped === true;
      let tier: string;
      let envdVersion = "";
      try {
        if (reboot) {
          // A cold start over the kept disk (filesystem-only pause, or `memory: false` asked at resume).
          const instance = await this.driver.reboot(sandbox.instanceId);
          envdVersion = await initEnvd(
            instance.envdUrl,
            {
              envVars: input.envVars ?? {},
              accessToken: input.envdAccessToken ?? "",
              defaultUser: "user",
              defaultWorkdir: "/home/user",
            },
            this.driver.envdInitTimeoutMs,
          );
          tier = "reboot";
        } else {
          tier = (await this.driver.resume(sandbox.instanceId)).tier;
        }
      } catch (error) {
        throw new AgentError("internal", `resuming sandbox '${input.sandboxId}' failed: ${(error as Error).message}`);
      }
      const exec = randomBytes(8).toString("hex");
      const generation = Math.max(this.nextGeneration(), sandbox.generation + 1);
      const instance = await this.driver.label(sandbox.instanceId, {
        exec,
        generation: String(generation),
        pausedMemory: "",
      });
      const summary = this.summaryOf(instance);
      if (!summary) throw new AgentError("internal", "instance lost its labels");
      this.sandboxes.set(input.sandboxId, summary);
      if (!(await this.routes.write(this.routeOf(summary)))) {
        this.log.warn("Redis holds a newer route than the resumed sandbox", { sandboxId: input.sandboxId, exec });
      }
      this.log.info("sandbox resumed", {
        sandboxId: input.sandboxId,
        exec,
        previousExec: sandbox.exec,
        tier,
        ms: round(performance.now() - startedAt),
      });
      return { ...this.placementOf(summary), envdVersion };
    });
  }

  /** Runs `fn` after every earlier pause/resume/checkpoint/kill of the same sandbox has finished. */
  private async exclusive<T>(sandboxId: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.locks.get(sandboxId) ?? Promise.resolve();
    const run = previous.then(fn, fn);
    const tail = run.then(
      () => undefined,
      () => undefined,
    );
    this.locks.set(sandboxId, tail);
    void tail.then(() => {
      if (this.locks.get(sandboxId) === tail) this.locks.delete(sandboxId);
    });
    return run;
  }

  private placementOf(summary: SandboxSummary): SandboxPlacement {
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

  private requireSandbox(sandboxId: string): SandboxSummary {
    const sandbox = this.sandboxes.get(sandboxId);
    if (!sandbox) throw new AgentError("not_found", `sandbox '${sandboxId}' is not on this node`);
    return sandbox;
  }

  private nextGeneration(): number {
    return Date.now() * 1000 + (this.generationCounter++ % 1000);
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
      servable: this.templates.ids().filter((id) => driverServes(this.templates.recipe(id), this.driver.name)),
    };
  }

  /**
   * Stops accepting creates, stops heartbeats and pools (pooled sandboxes are removed) and leaves claimed
   * sandboxes running: a restarted agent re-adopts them. `killAll` removes them too.
   */
  async close(options: { killAll?: boolean } = {}): Promise<void> {
    this.draining = true;
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    for (const timer of this.checkpointTimers.values()) clearTimeout(timer);
    this.checkpointTimers.clear();
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
      if (instance.paused && !instance.checkpointed && !instance.stopped) this.scheduleCheckpoint(summary.sandboxId);
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
      state: summary.paused ? "paused" : "running",
      team: summary.teamId,
      public: labels.publicTraffic === "1",
      trafficTokenHash: labels.trafficTokenHash ?? "",
      autoResume: labels.autoResume === "1",
      maskRequestHost: "",
    };
  }
}
