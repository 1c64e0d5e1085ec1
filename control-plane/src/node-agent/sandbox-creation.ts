import { isSandboxId } from "@warren/proto/redis";
import {
  CapacityExceeded,
  type Instance,
  type InstanceSpec,
  type SandboxResources,
  type SnapshotImage,
} from "../runtime/driver.js";
import { CLOSED_EGRESS, type EgressPolicy } from "../runtime/egress/policy.js";
import { driverServes } from "../templates/catalog.js";
import type { BuiltTemplate, TemplateStore } from "../templates/store.js";
import type { NodeAgentConfig } from "./config.js";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";
import type { NodeSnapshots } from "./node-snapshots.js";
import { type ActivationDeps, activateSandbox, checkEgress } from "./sandbox-activation.js";
import { type CreateSandboxInput, resolveResources, type SandboxPlacement } from "./sandbox-model.js";
import type { SnapshotPools } from "./snapshot-pools.js";
import { type StartGate, StartQueueFull } from "./start-gate.js";
import type { TemplateBuilds } from "./template-builds.js";
import { volumeBinds } from "./volume-binds.js";
import { type WarmPool, WarmPoolClosed } from "./warm-pool.js";

/** What creating works on; the activation's deps too (the new sandbox is added to `sandboxes` once routed). */
export interface SandboxCreationDeps extends ActivationDeps {
  readonly config: Pick<NodeAgentConfig, "maxSandboxes" | "volumesDir">;
  readonly templates: TemplateStore;
  readonly builds: Pick<TemplateBuilds, "ensure" | "pool" | "idlePools" | "holdRefills">;
  readonly snapshots: Pick<NodeSnapshots, "find">;
  readonly snapshotPools: Pick<SnapshotPools, "take" | "next" | "ensure" | "idlePools">;
  readonly startGate: StartGate;
  readonly isDraining: () => boolean;
  readonly log: Logger;
}

/** How a create gets its instance: the fields of the request that decide between a warm pool and a start. */
interface StartPlan {
  readonly input: CreateSandboxInput;
  readonly template: BuiltTemplate;
  readonly snapshot: SnapshotImage | undefined;
  readonly resources: SandboxResources;
  readonly egress: EgressPolicy;
  readonly volumes: { source: string; destination: string }[];
}

/**
 * The create path: a request is checked against the node (ids, template, driver, capacity), then gets its
 * instance from a warm pool (the template's, or a custom template's snapshot pool: a ready one, else the pool's
 * next start to finish) or a start through the start gate (cold, or from a snapshot), and is activated. Creates
 * in progress count towards the node's limit.
 */
export class SandboxCreation {
  private readonly creating = new Set<string>();

  constructor(private readonly deps: SandboxCreationDeps) {}

  /** Creates that have not yet finished (or failed). */
  get inProgress(): number {
    return this.creating.size;
  }

  /** `signal`: the caller gave up (its deadline passed); a create still waiting for a start slot then leaves. */
  async create(input: CreateSandboxInput, signal?: AbortSignal): Promise<SandboxPlacement> {
    const template = this.admit(input);
    const { driver, snapshots } = this.deps;
    const snapshot = input.snapshotId ? await snapshots.find(input.snapshotId, input.templateId) : undefined;
    // A memory snapshot's processes run in the memory they had: the snapshot's resources, not the request's. The
    // disk is a new one under the snapshot's layers, so it may be the size asked for (a template's sandboxes get
    // the template's disk size, not the build sandbox's).
    const asked = resolveResources(template, input.resources);
    const resources = snapshot?.memory
      ? { ...snapshot.resources, ...(input.resources?.diskSizeMB ? { diskSizeMB: asked.diskSizeMB } : {}) }
      : asked;
    const egress = checkEgress(input.egress ?? CLOSED_EGRESS, driver);
    this.creating.add(input.sandboxId);
    const log = this.deps.log.child({ sandboxId: input.sandboxId, templateId: input.templateId });
    try {
      const volumes = await volumeBinds(input, this.deps.config.volumesDir, driver);
      const plan: StartPlan = { input, template, snapshot, resources, egress, volumes };
      const fromPool = snapshot && input.warmPool === true && !input.command && volumes.length === 0;
      const pool = this.poolFor(plan);
      let instance = pool
        ? pool.take()
        : fromPool
          ? this.deps.snapshotPools.take(snapshot.snapshotId, resources)
          : undefined;
      let pooled = instance !== undefined;
      let waitedForPool = false;
      if (!instance) {
        // An empty pool: its next start to finish (a refill under way, or one begun for this create) serves it.
        const fromPoolStart = pool
          ? pool.next(signal)
          : fromPool
            ? this.deps.snapshotPools.next(snapshot.snapshotId, resources, signal)
            : undefined;
        const started = await this.start(plan, fromPoolStart, signal);
        instance = started.instance;
        pooled = started.fromPool;
        waitedForPool = started.fromPool;
      }
      const previousToken = snapshot?.memory ? input.snapshotEnvdAccessToken : undefined;
      const placement = await activateSandbox(this.deps, {
        started: instance,
        input,
        egress,
        pooled,
        waitedForPool,
        log,
        ...(previousToken ? { currentAccessToken: previousToken } : {}),
      });
      if (fromPool && !this.deps.isDraining()) {
        this.deps.snapshotPools.ensure(input.templateId, snapshot.snapshotId, resources);
      }
      return placement;
    } finally {
      this.creating.delete(input.sandboxId);
    }
  }

  /**
   * A start the node had no room for (CapacityExceeded: its disk budget) may have the warm pools' idle sandboxes'
   * room: a pool that followed a burst holds disks that a create of another template or size needs, and a pooled
   * sandbox is cheaper to start again than a create is to refuse. Ready sandboxes go, one at a time from the
   * fullest pool, until the disks they held cover the shortfall; resolves with how many went (0: none idle).
   */
  private async makeRoom(shortMB: number): Promise<number> {
    const idle = [...this.deps.builds.idlePools(), ...this.deps.snapshotPools.idlePools()];
    let freedMB = 0;
    let released = 0;
    while (freedMB < shortMB) {
      const fullest = idle
        .filter(({ pool }) => pool.readyCount > 0)
        .sort((a, b) => b.pool.readyCount - a.pool.readyCount)[0];
      if (!fullest || (await fullest.pool.release(1)) === 0) break;
      freedMB += fullest.diskSizeMB;
      released++;
    }
    if (released > 0) {
      this.deps.log.info("warm pools gave back idle sandboxes to a create the node had no room for", {
        released,
        freedMB,
        shortMB,
      });
    }
    return released;
  }

  /** Checks the request against this node; returns its template, which must be built here already. */
  private admit(input: CreateSandboxInput): BuiltTemplate {
    const { driver, templates, sandboxes, config } = this.deps;
    if (this.deps.isDraining()) throw new AgentError("unavailable", "node agent is shutting down");
    if (!isSandboxId(input.sandboxId)) {
      throw new AgentError(
        "invalid_argument",
        `invalid sandbox id '${input.sandboxId}' (lowercase letters and digits, at most 63)`,
      );
    }
    if (!templates.knows(input.templateId)) {
      throw new AgentError(
        "not_found",
        `unknown template '${input.templateId}' (this node has: ${templates.ids().join(", ")})`,
      );
    }
    const required = templates.recipe(input.templateId).requiresDriver;
    if (required && !driverServes(templates.recipe(input.templateId), driver.name)) {
      throw new AgentError(
        "failed_precondition",
        `template '${input.templateId}' runs only on ${required} nodes; this node's driver is ${driver.name}`,
      );
    }
    if (sandboxes.has(input.sandboxId) || this.creating.has(input.sandboxId)) {
      throw new AgentError("already_exists", `sandbox '${input.sandboxId}' already exists on this node`);
    }
    if (sandboxes.size + this.creating.size >= config.maxSandboxes) {
      throw new AgentError("resource_exhausted", `node is full (${config.maxSandboxes} sandboxes)`);
    }
    const template = templates.ready(input.templateId);
    if (!template) {
      this.deps.builds.ensure(input.templateId).catch(() => undefined);
      throw new AgentError("unavailable", `template '${input.templateId}' is being built on this node; retry later`);
    }
    return template;
  }

  /** The template's warm pool when the request is what its sandboxes are: defaults, no command, snapshot or volume. */
  private poolFor({ input, template, snapshot, resources, volumes }: StartPlan): WarmPool | undefined {
    const defaults = template.recipe.defaults;
    const poolable =
      volumes.length === 0 &&
      !input.command &&
      !snapshot &&
      resources.cpuCount === defaults.cpuCount &&
      resources.memoryMB === defaults.memoryMB &&
      resources.diskSizeMB === defaults.diskSizeMB;
    return poolable ? this.deps.builds.pool(input.templateId) : undefined;
  }

  /**
   * The pool's start this create waits for, else (no pool, or it closed meanwhile) a start of its own on a start
   * slot; failures as AgentErrors.
   */
  private async start(
    { input, template, snapshot, resources, egress, volumes }: StartPlan,
    fromPoolStart: Promise<Instance> | undefined,
    signal: AbortSignal | undefined,
  ): Promise<{ instance: Instance; fromPool: boolean }> {
    const { driver } = this.deps;
    try {
      if (fromPoolStart) {
        const served = await fromPoolStart.catch((error: unknown) => {
          // The pool went away while this create waited (a custom template's pool evicted or its snapshot
          // deleted): it starts on its own, as it would have without a pool. A stopping agent says so below.
          if (error instanceof WarmPoolClosed && !this.deps.isDraining()) return undefined;
          throw error;
        });
        if (served) return { instance: served, fromPool: true };
      }
      const instance = await this.deps.startGate.run(async () => {
        // Shutting down while this create waited: it starts nothing a stopping agent would leave behind.
        if (this.deps.isDraining()) throw new AgentError("unavailable", "node agent is shutting down");
        const spec: InstanceSpec = {
          template,
          resources,
          ...(input.command ? { command: input.command } : {}),
          ...(driver.setEgress ? { egress } : {}),
          ...(snapshot ? { snapshotId: snapshot.snapshotId } : {}),
          ...(volumes.length > 0 ? { volumes } : {}),
        };
        return driver.create(spec).catch(async (error: unknown) => {
          if (!(error instanceof CapacityExceeded) || error.diskShortMB === undefined) throw error;
          const shortMB = error.diskShortMB;
          // No pool refills into the room given back before this create has taken it.
          return this.deps.builds.holdRefills(async () => {
            if ((await this.makeRoom(shortMB)) === 0) throw error;
            return driver.create(spec);
          });
        });
      }, signal);
      return { instance, fromPool: false };
    } catch (error) {
      if (error instanceof AgentError) throw error;
      if (error instanceof StartQueueFull || error instanceof CapacityExceeded) {
        throw new AgentError("resource_exhausted", error.message);
      }
      if (signal?.aborted) {
        throw new AgentError("unavailable", `the create of '${input.sandboxId}' was abandoned by its caller`);
      }
      if (error instanceof WarmPoolClosed) throw new AgentError("unavailable", "node agent is shutting down");
      throw new AgentError("internal", `sandbox '${input.sandboxId}' failed to start: ${(error as Error).message}`);
    }
  }
}
