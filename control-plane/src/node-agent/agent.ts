import { cpus } from "node:os";
import type { InstanceStats, RuntimeDriver, SnapshotImage } from "../runtime/driver.js";
import type { EgressPolicy } from "../runtime/egress/policy.js";
import type { BuiltTemplate, TemplateStore } from "../templates/store.js";
import { adoptSandboxes } from "./adoption.js";
import type { NodeAgentConfig } from "./config.js";
import { fetchLeaseEvents } from "./envd-client.js";
import { AgentError } from "./errors.js";
import { type ImageSource, type ImportedImage, importImage } from "./image-import.js";
import type { Logger } from "./log.js";
import { NodeHeartbeat } from "./node-heartbeat.js";
import { NodeSnapshots } from "./node-snapshots.js";
import type { RoutePublisher } from "./routes.js";
import { checkEgress } from "./sandbox-activation.js";
import { SandboxCreation } from "./sandbox-creation.js";
import { type CommandEvent, type CommandSpec, runInSandbox, writeInSandbox } from "./sandbox-exec.js";
import { parseSandboxLog, type SandboxLogLine } from "./sandbox-log.js";
import {
  type CreateSandboxInput,
  type LeaseJournalEntry,
  type NodeInfo,
  type ResumeSandboxInput,
  type SandboxPlacement,
  type SandboxSummary,
  sandboxRoute,
} from "./sandbox-model.js";
import { SandboxPauses } from "./sandbox-pauses.js";
import { SandboxQueue } from "./sandbox-queue.js";
import type { ShippedFromBuilder } from "./shipped-from-builder.js";
import { SnapshotPools } from "./snapshot-pools.js";
import { SnapshotPublishing } from "./snapshot-publishing.js";
import type { PublishedSnapshot } from "./snapshot-store.js";
import { StartGate } from "./start-gate.js";
import { TemplateBuilds } from "./template-builds.js";
import type { WarmPool } from "./warm-pool.js";
import { SandboxWatchdog } from "./watchdog.js";

/**
 * The node agent: sandboxes by id on top of a runtime driver, and what the Connect service (service.ts) calls.
 * It owns the node's sandboxes and wires the parts that work on them: creates (sandbox-creation.ts), pauses,
 * snapshots, template builds and warm pools, heartbeats, the watchdog; kill (route first, then the instance) and
 * the calls into a running sandbox's envd are its own.
 */
export class NodeAgent {
  private readonly sandboxes = new Map<string, SandboxSummary>();
  /** Per-sandbox queue of pause/resume/checkpoint/snapshot/kill, so they never interleave. */
  private readonly queue = new SandboxQueue();
  private readonly snapshots: NodeSnapshots;
  /** The cluster's snapshot store, as this node publishes to it and pulls from it. */
  private readonly published: SnapshotPublishing;
  /** Warm sandboxes of custom templates (their snapshots), for creates that ask for them. */
  private readonly snapshotPools: SnapshotPools;
  private readonly pauses: SandboxPauses;
  /** Template builds (once per agent) and the warm pools of built templates. */
  private readonly builds: TemplateBuilds;
  private readonly creation: SandboxCreation;
  /**
   * Starts run at most `maxConcurrentStarts` at once, creates first in arrival order, pool refills on the slots
   * no create waits for (claims from a warm pool never wait).
   */
  private readonly startGate: StartGate;
  private readonly heartbeat: NodeHeartbeat;
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
    /** Where the shipped templates come from the master's template builder (a driver that takes its layers). */
    private readonly shipped?: ShippedFromBuilder,
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
    this.builds = new TemplateBuilds({
      driver,
      templates,
      config,
      startGate: this.startGate,
      isDraining: () => this.draining,
      log,
    });
    this.snapshotPools = new SnapshotPools(
      this.builds.poolOptions(),
      config.templatePools ?? 4,
      async (templateId, snapshotId, resources, start) => {
        const template = this.templates.ready(templateId);
        if (!template || this.draining) throw new Error(`template '${templateId}' is not ready on this node`);
        return this.builds.startPooled(template, resources, start, snapshotId);
      },
      (instance) => this.driver.kill(instance.instanceId),
      log.child({ part: "template-pools" }),
    );
    this.published = new SnapshotPublishing(config, this.snapshots, log.child({ part: "store" }));
    this.creation = new SandboxCreation({
      config,
      driver,
      templates,
      builds: this.builds,
      snapshots: this.snapshots,
      snapshotPools: this.snapshotPools,
      startGate: this.startGate,
      routes,
      sandboxes: this.sandboxes,
      routeOf: (summary) => this.routeOf(summary),
      nextGeneration: () => this.nextGeneration(),
      isDraining: () => this.draining,
      log,
    });
    this.heartbeat = new NodeHeartbeat({
      config,
      driver,
      templates,
      builds: this.builds,
      snapshotPools: this.snapshotPools,
      routes,
      sandboxes: this.sandboxes,
      routeOf: (summary) => this.routeOf(summary),
      isDraining: () => this.draining,
      ...(shipped ? { templatesWanted: () => shipped.wanted() } : {}),
      log,
    });
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
    await this.heartbeat.start();
    this.watchdog.start();
    for (const id of this.config.prebuildTemplates) {
      this.ensureTemplate(id).catch((error) => this.log.error("template build failed", { templateId: id, error }));
    }
  }

  /** Builds the template unless cached (once per agent), then starts its warm pool when it has one. */
  ensureTemplate(templateId: string): Promise<BuiltTemplate> {
    return this.builds.ensure(templateId);
  }

  /** The warm pool of a template, once it exists (tests and benchmarks wait on `filled()`). */
  pool(templateId: string): WarmPool | undefined {
    return this.builds.pool(templateId);
  }

  /**
   * Creates a sandbox from a warm pool or a start (sandbox-creation.ts). `signal`: the caller gave up (its
   * deadline passed); a create still waiting for a start slot then leaves.
   */
  create(input: CreateSandboxInput, signal?: AbortSignal): Promise<SandboxPlacement> {
    return this.creation.create(input, signal);
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
  publishSnapshot(snapshotId: string, labels: Readonly<Record<string, string>>): Promise<PublishedSnapshot> {
    return this.published.publish(snapshotId, labels);
  }

  /** The snapshot ids published to the cluster's store. */
  listPublishedSnapshots(): Promise<string[]> {
    return this.published.listPublished();
  }

  /** Removes a published snapshot from the cluster's store; idempotent. */
  unpublishSnapshot(snapshotId: string): Promise<void> {
    return this.published.unpublish(snapshotId);
  }

  /** Removes the store's layers no published snapshot stacks, past `graceMs`; resolves with their names. */
  collectStoreLayers(graceMs: number): Promise<string[]> {
    return this.published.collectLayers(graceMs);
  }

  /** Pulls a published snapshot from the store (digests checked, only layers this node lacks) unless it has it. */
  pullSnapshot(snapshotId: string, digest: string): Promise<{ snapshot: SnapshotImage; downloadedBytes: number }> {
    return this.published.pull(snapshotId, digest);
  }

  /**
   * An OCI image (or a Debian system made here) as a files-only snapshot over `scratch`, the base of a template
   * built `fromImage` (image-import.ts).
   */
  async importImage(snapshotId: string, source: ImageSource): Promise<ImportedImage> {
    const deps = { driver: this.driver, config: this.config, log: this.log };
    return importImage(deps, () => this.ensureTemplate("scratch"), { snapshotId, source });
  }

  /** A shipped template this node awaits, built by the master's template builder (shipped-from-builder.ts). */
  async adoptTemplate(templateId: string, snapshotId: string, buildId: string): Promise<void> {
    if (!this.shipped) {
      throw new AgentError(
        "failed_precondition",
        `the ${this.driver.name} driver cannot take templates from the builder`,
      );
    }
    await this.shipped.adopt(templateId, snapshotId, buildId);
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

  /** The snapshot as a byte stream for another node (ImportSnapshot there), without the layers that node has. */
  exportSnapshot(snapshotId: string, omitLayers?: ReadonlySet<string>): Promise<AsyncIterable<Uint8Array>> {
    return this.snapshots.export(snapshotId, omitLayers);
  }

  /** This node's snapshot layers (a move's source leaves them out of its stream). */
  async localLayers(): Promise<readonly string[]> {
    return (await this.snapshots.layers?.localLayers()) ?? [];
  }

  /** Stores a snapshot streamed from another node agent; on failure nothing of it is left. */
  importSnapshot(snapshotId: string, data: AsyncIterable<Uint8Array>): Promise<SnapshotImage> {
    return this.snapshots.import(snapshotId, data);
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
    // The route goes first, so no new traffic reaches a dying sandbox. A route that cannot be deleted (Redis away)
    // does not save the sandbox: forgotten here, it would run on with its mounts until the agent's next start.
    const routeError = await this.routes.delete(sandboxId, sandbox.exec, sandbox.generation).then(
      () => undefined,
      (error: unknown) => error as Error,
    );
    // Unreachable (no route) and stopped (no process) is what a kill waits for; the host resources follow.
    await this.driver.kill(sandbox.instanceId, { reclaimLater: true });
    if (routeError) {
      this.log.warn("sandbox killed; its route could not be deleted", { sandboxId, error: routeError });
      // The caller (the master) removes the route itself when a kill fails.
      throw new AgentError(
        "unavailable",
        `sandbox '${sandboxId}' was killed, but its route could not be deleted: ${routeError.message}`,
      );
    }
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
    return this.heartbeat.info();
  }

  /**
   * Stops accepting creates, stops heartbeats and pools (pooled sandboxes are removed) and leaves claimed
   * sandboxes running: a restarted agent re-adopts them. `killAll` removes them too, and any instance the driver
   * still lists that no sandbox claims.
   */
  async close(options: { killAll?: boolean } = {}): Promise<void> {
    this.draining = true;
    this.heartbeat.stop();
    this.shipped?.close();
    this.watchdog.stop();
    this.pauses.close();
    await this.builds.closePools();
    await this.snapshotPools.closeAll();
    if (options.killAll) {
      // Creates already starting finish first (those still waiting for a start slot give up on draining), so
      // none is left running behind a stopped agent.
      const until = Date.now() + 30_000;
      while (this.creation.inProgress > 0 && Date.now() < until)
        await new Promise((resolve) => setTimeout(resolve, 50));
      for (const id of [...this.sandboxes.keys()])
        await this.kill(id).catch((error) => this.log.error("kill failed", { sandboxId: id, error }));
      // And what no sandbox claims: a pooled instance whose removal failed earlier (its processes outlived the
      // wait) is still in the driver's list with its mounts, and would otherwise outlive the agent.
      for (const { instanceId } of this.driver.list())
        await this.driver.kill(instanceId).catch((error) => this.log.error("kill failed", { instanceId, error }));
      await this.routes.removeNode(this.config.nodeId).catch(() => undefined);
    }
    await this.driver.close();
    await this.routes.close();
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
