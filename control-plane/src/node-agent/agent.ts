import { cpus, freemem, totalmem } from "node:os";
import { join } from "node:path";
import { isSandboxId } from "@warren/proto/redis";
import type { Instance, InstanceStats, RuntimeDriver, SnapshotImage } from "../runtime/driver.js";
import { CLOSED_EGRESS, type EgressPolicy, OPEN_EGRESS } from "../runtime/egress/policy.js";
import { driverServes } from "../templates/catalog.js";
import type { ImageCredentials } from "../templates/oci/pull.js";
import type { BuiltTemplate, TemplateStore } from "../templates/store.js";
import { adoptSandboxes } from "./adoption.js";
import type { NodeAgentConfig } from "./config.js";
import { fetchLeaseEvents } from "./envd-client.js";
import { AgentError } from "./errors.js";
import { type ImportedImage, importImage } from "./image-import.js";
import type { Logger } from "./log.js";
import { NodeSnapshots } from "./node-snapshots.js";
import type { RoutePublisher } from "./routes.js";
import { activateSandbox, checkEgress } from "./sandbox-activation.js";
import { type CommandEvent, type CommandSpec, runInSandbox, writeInSandbox } from "./sandbox-exec.js";
import { parseSandboxLog, type SandboxLogLine } from "./sandbox-log.js";
import {
  type CreateSandboxInput,
  type LeaseJournalEntry,
  type NodeInfo,
  type ResumeSandboxInput,
  resolveResources,
  type SandboxPlacement,
  type SandboxSummary,
  sandboxRoute,
} from "./sandbox-model.js";
import { SandboxPauses } from "./sandbox-pauses.js";
import { SandboxQueue } from "./sandbox-queue.js";
import { SnapshotPools } from "./snapshot-pools.js";
import { type PublishedSnapshot, SnapshotStore } from "./snapshot-store.js";
import { StartGate, StartQueueFull } from "./start-gate.js";
import { volumeBinds } from "./volume-binds.js";
import { WarmPool, type WarmPoolOptions } from "./warm-pool.js";
import { SandboxWatchdog } from "./watchdog.js";

/**
 * The node agent: sandboxes by id on top of a runtime driver. Create takes a warm sandbox (or starts one),
 * initialises envd, records the binding with the instance (so it survives an agent crash), and writes the route;
 * kill deletes the route first, then the instance. Heartbeats publish capacity for the master's scheduler.
 */
export class NodeAgent {
  private readonly sandboxes = new Map<string, SandboxSummary>();
  private readonly creating = new Set<string>();
  /** Per-sandbox queue of pause/resume/checkpoint/snapshot/kill, so they never interleave. */
  private readonly queue = new SandboxQueue();
  private readonly snapshots: NodeSnapshots;
  private readonly store: SnapshotStore;
  /** Warm sandboxes of custom templates (their snapshots), for creates that ask for them. */
  private readonly snapshotPools: SnapshotPools;
  private readonly pauses: SandboxPauses;
  private readonly pools = new Map<string, WarmPool>();
  /**
   * Starts run at most `maxConcurrentStarts` at once, creates first in arrival order, pool refills on the slots
   * no create waits for (claims from a warm pool never wait).
   */
  private readonly startGate: StartGate;
  private readonly builds = new Map<string, Promise<BuiltTemplate>>();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private readonly watchdog: SandboxWatchdog;
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
    private readonly routes: RoutePublisher,
    private readonly log: Logger,
  ) {
    // Tests build configs by hand; an absent limit is the loader's default.
    this.startGate = new StartGate(
      config.maxConcurrentStarts || Math.max(2, cpus().length * 2),
      config.poolRefill ?? 2,
      config.maxQueuedStarts ?? 256,
    );
    this.snapshots = new NodeSnapshots(driver, this.queue, (sandboxId) => this.requireSandbox(sandboxId), log);
    this.watchdog = new SandboxWatchdog({
      driver,
      queue: this.queue,
      routes,
      sandboxes: this.sandboxes,
      isDraining: () => this.draining,
      log,
    });
    this.pauses = new SandboxPauses({
      driver,
      queue: this.queue,
      routes,
      sandboxes: this.sandboxes,
      requireSandbox: (sandboxId) => this.requireSandbox(sandboxId),
      routeOf: (summary) => this.routeOf(summary),
      nextGeneration: () => this.nextGeneration(),
      checkpointAfterMs: config.checkpointAfterMs,
      isDraining: () => this.draining,
      log,
    });
    this.snapshotPools = new SnapshotPools(
      this.poolOptions(),
      config.templatePools ?? 4,
      async (templateId, snapshotId, resources) => {
        const template = this.templates.ready(templateId);
        if (!template || this.draining) throw new Error(`template '${templateId}' is not ready on this node`);
        return this.driver.create({
          template,
          resources,
          labels: { pooled: "1" },
          ...(this.driver.setEgress ? { egress: OPEN_EGRESS } : {}),
          snapshotId,
        });
      },
      (instance) => this.driver.kill(instance.instanceId),
      log.child({ part: "template-pools" }),
    );
    // Tests build configs by hand; an absent store is the loader's default.
    this.store = new SnapshotStore(
      config.store ?? { url: "oci:/var/lib/warren/store", insecure: false },
      join(config.stateDir, "store-work"),
      log.child({ part: "store" }),
    );
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
    this.watchdog.start();
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
          // An empty root has nothing to start: it is checked through the image templates stacked on it.
          if (this.templates.recipe(image.templateId).empty) return;
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

  /** Every warm pool's sizing and refill settings (pool-sizing.ts, warm-pool.ts). */
  private poolOptions(): WarmPoolOptions {
    const floor = this.config.poolSize ?? 0;
    return {
      sizing: {
        floor,
        ceiling: Math.max(floor, this.config.poolMax ?? floor),
        windowMs: this.config.poolWindowMs ?? 60_000,
      },
      refillConcurrency: this.config.poolRefill ?? 2,
      schedule: (start) => this.startGate.runBackground(start),
    };
  }

  private startPool(template: BuiltTemplate): void {
    if (this.draining || this.pools.has(template.templateId)) return;
    const options = this.poolOptions();
    if (!this.config.poolTemplates.includes(template.templateId) || options.sizing.floor === 0) return;
    const pool = new WarmPool(
      template.templateId,
      options,
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

  /** `signal`: the caller gave up (its deadline passed); a create still waiting for a start slot then leaves. */
  async create(input: CreateSandboxInput, signal?: AbortSignal): Promise<SandboxPlacement> {
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
    const snapshot = input.snapshotId ? await this.snapshots.find(input.snapshotId, input.templateId) : undefined;
    // A memory snapshot's processes run in the memory they had: the snapshot's resources, not the request's.
    const resources = snapshot?.memory ? snapshot.resources : resolveResources(template, input.resources);
    const egress = checkEgress(input.egress ?? CLOSED_EGRESS, this.driver);
    this.creating.add(input.sandboxId);
    const log = this.log.child({ sandboxId: input.sandboxId, templateId: input.templateId });
    try {
      const defaults = template.recipe.defaults;
      const volumes = await volumeBinds(input, this.config.volumesDir, this.driver);
      const poolable =
        volumes.length === 0 &&
        !input.command &&
        !snapshot &&
        resources.cpuCount === defaults.cpuCount &&
        resources.memoryMiB === defaults.memoryMiB &&
        resources.diskMiB === defaults.diskMiB;
      const fromPool = snapshot && input.warmPool === true && !input.command && volumes.length === 0;
      const pool = poolable ? this.pools.get(input.templateId) : undefined;
      let instance = pool
        ? pool.take()
        : fromPool
          ? this.snapshotPools.take(snapshot.snapshotId, resources)
          : undefined;
      let pooled = instance !== undefined;
      if (!instance) {
        try {
          instance = await this.startGate.run(async () => {
            // Shutting down while this create waited: it starts nothing a stopping agent would leave behind.
            if (this.draining) throw new AgentError("unavailable", "node agent is shutting down");
            // A refill that finished while this create waited for its turn serves it at once.
            const ready = pool?.takeReady();
            if (ready) {
              pooled = true;
              return ready;
            }
            return this.driver.create({
              template,
              resources,
              ...(input.command ? { command: input.command } : {}),
              ...(this.driver.setEgress ? { egress } : {}),
              ...(snapshot ? { snapshotId: snapshot.snapshotId } : {}),
              ...(volumes.length > 0 ? { volumes } : {}),
            });
          }, signal);
        } catch (error) {
          if (error instanceof AgentError) throw error;
          if (error instanceof StartQueueFull) throw new AgentError("resource_exhausted", error.message);
          if (signal?.aborted) {
            throw new AgentError("unavailable", `the create of '${input.sandboxId}' was abandoned by its caller`);
          }
          throw new AgentError("internal", `sandbox '${input.sandboxId}' failed to start: ${(error as Error).message}`);
        }
      }
      const previousToken = snapshot?.memory ? input.snapshotEnvdAccessToken : undefined;
      const placement = await this.activate(instance, input, egress, pooled, log, previousToken);
      if (fromPool && !this.draining) this.snapshotPools.ensure(input.templateId, snapshot.snapshotId, resources);
      return placement;
    } finally {
      this.creating.delete(input.sandboxId);
    }
  }

  /** Captures a sandbox as snapshot `snapshotId` on this node (NodeSnapshots.capture). */
  snapshot(sandboxId: string, snapshotId: string, filesOnly = false): Promise<SnapshotImage> {
    return this.snapshots.capture(sandboxId, snapshotId, filesOnly);
  }

  /**
   * Runs a command in a running sandbox through its envd (a template build's steps, start and ready commands).
   * Ending the iteration early leaves the process running.
   */
  runCommand(
    sandboxId: string,
    envdAccessToken: string,
    spec: CommandSpec,
    signal: AbortSignal,
  ): AsyncGenerator<CommandEvent> {
    const sandbox = this.requireSandbox(sandboxId);
    if (sandbox.paused) throw new AgentError("failed_precondition", `sandbox '${sandboxId}' is paused`);
    return runInSandbox(sandbox.envdUrl, envdAccessToken, spec, signal);
  }

  /** Publishes a snapshot of this node to the cluster's store (a built template); resolves with its digest. */
  async publishSnapshot(snapshotId: string, labels: Readonly<Record<string, string>>): Promise<PublishedSnapshot> {
    const data = await this.snapshots.export(snapshotId);
    return this.store.publish(snapshotId, data, labels);
  }

  /** The snapshot ids published to the cluster's store. */
  listPublishedSnapshots(): Promise<string[]> {
    return this.store.listPublished();
  }

  /** Removes a published snapshot from the cluster's store; idempotent. */
  unpublishSnapshot(snapshotId: string): Promise<void> {
    return this.store.unpublish(snapshotId);
  }

  /** Pulls a published snapshot from the store (digest checked) unless this node has it already. */
  async pullSnapshot(snapshotId: string, digest: string): Promise<SnapshotImage> {
    const have = (await this.snapshots.list()).find((s) => s.snapshotId === snapshotId);
    if (have) return have;
    return this.store.pull(snapshotId, digest, (data) => this.snapshots.import(snapshotId, data));
  }

  /** An OCI image as a files-only snapshot over `scratch`, the base of a template built `fromImage` (image-import.ts). */
  async importImage(
    snapshotId: string,
    image: string,
    credentials: ImageCredentials | undefined,
  ): Promise<ImportedImage> {
    const deps = { driver: this.driver, config: this.config, log: this.log };
    return importImage(deps, () => this.ensureTemplate("scratch"), { snapshotId, image, credentials });
  }

  /** Writes a file into a running sandbox through its envd, as root (a template build's COPY archive). */
  async writeFile(sandboxId: string, envdAccessToken: string, path: string, data: Uint8Array): Promise<void> {
    const sandbox = this.requireSandbox(sandboxId);
    if (sandbox.paused) throw new AgentError("failed_precondition", `sandbox '${sandboxId}' is paused`);
    await writeInSandbox(sandbox.envdUrl, envdAccessToken, path, data);
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.snapshotPools.drop(snapshotId);
    return this.snapshots.delete(snapshotId);
  }

  listSnapshots(): Promise<SnapshotImage[]> {
    return this.snapshots.list();
  }

  /** The snapshot as a byte stream for another node (ImportSnapshot there). */
  exportSnapshot(snapshotId: string): Promise<AsyncIterable<Uint8Array>> {
    return this.snapshots.export(snapshotId);
  }

  /** Stores a snapshot streamed from another node agent; on failure nothing of it is left. */
  importSnapshot(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    return this.snapshots.import(snapshotId, data);
  }

  /** Makes a started instance the sandbox (sandbox-activation.ts). */
  private activate(
    started: Instance,
    input: Omit<CreateSandboxInput, "templateId">,
    egress: EgressPolicy,
    pooled: boolean,
    log: Logger,
    currentAccessToken?: string,
  ): Promise<SandboxPlacement> {
    const deps = {
      driver: this.driver,
      routes: this.routes,
      sandboxes: this.sandboxes,
      routeOf: (summary: SandboxSummary) => this.routeOf(summary),
      nextGeneration: () => this.nextGeneration(),
    };
    return activateSandbox(deps, {
      started,
      input,
      egress,
      pooled,
      log,
      ...(currentAccessToken ? { currentAccessToken } : {}),
    });
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
    const checked = checkEgress(policy, this.driver);
    await this.queue.run(sandboxId, async () => {
      const sandbox = this.requireSandbox(sandboxId);
      await this.driver.setEgress?.(sandbox.instanceId, checked);
      this.log.info("sandbox egress policy replaced", {
        sandboxId,
        allowOut: checked.allowOut.length,
        denyOut: checked.denyOut.length,
      });
    });
  }

  /** Deletes the route first (the proxy stops sending traffic), then removes the sandbox entirely. */
  async kill(sandboxId: string, exec?: string): Promise<void> {
    this.pauses.forget(sandboxId);
    return this.queue.run(sandboxId, () => this.killNow(sandboxId, exec));
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

  /** Pauses a sandbox (sandbox-pauses.ts: the freezer, then a checkpoint on disk; or filesystem only). */
  pause(sandboxId: string, memory: boolean): Promise<void> {
    return this.pauses.pause(sandboxId, memory);
  }

  /** Resumes a paused sandbox as a new incarnation (sandbox-pauses.ts). */
  resume(input: ResumeSandboxInput): Promise<SandboxPlacement> {
    return this.pauses.resume(input);
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

  /**
   * envd's process lease journal after `after` (the master appends it to the ledger). Best effort: an envd that
   * does not answer in time, or predates leases, has none to report now.
   */
  async leaseEvents(sandboxId: string, envdAccessToken: string, after: number): Promise<LeaseJournalEntry[]> {
    const sandbox = this.sandboxes.get(sandboxId);
    if (!sandbox || sandbox.paused) return [];
    return fetchLeaseEvents(sandbox.envdUrl, envdAccessToken, after);
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
    this.watchdog.stop();
    this.pauses.close();
    for (const pool of this.pools.values()) await pool.close();
    await this.snapshotPools.closeAll();
    if (options.killAll) {
      // Creates already starting finish first (those still waiting for a start slot give up on draining), so
      // none is left running behind a stopped agent.
      const until = Date.now() + 30_000;
      while (this.creating.size > 0 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 50));
      for (const id of [...this.sandboxes.keys()])
        await this.kill(id).catch((error) => this.log.error("kill failed", { sandboxId: id, error }));
      await this.routes.removeNode(this.config.nodeId).catch(() => undefined);
    }
    await this.driver.close();
    await this.routes.close();
  }

  private async heartbeat(): Promise<void> {
    if (!this.draining) {
      // Pools whose demand faded give their extra sandboxes back.
      for (const pool of this.pools.values()) void pool.trim();
      void this.snapshotPools.trim();
    }
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

  /** Re-adopts what a previous agent left (adoption.ts). */
  private async reconcile(): Promise<void> {
    await adoptSandboxes({
      driver: this.driver,
      routes: this.routes,
      sandboxes: this.sandboxes,
      pauses: this.pauses,
      routeOf: (summary) => this.routeOf(summary),
      nodeId: this.config.nodeId,
      log: this.log,
    });
  }

  private routeOf(summary: SandboxSummary) {
    const labels = this.driver.list().find((i) => i.instanceId === summary.instanceId)?.labels ?? {};
    return sandboxRoute(summary, labels, this.config);
  }
}
