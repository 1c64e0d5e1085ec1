import type { Instance, RuntimeDriver, SandboxResources } from "../runtime/driver.js";
import { OPEN_EGRESS } from "../runtime/egress/policy.js";
import { driverServes } from "../templates/catalog.js";
import type { BuiltTemplate, TemplateStore } from "../templates/store.js";
import type { NodeAgentConfig } from "./config.js";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";
import type { StartGate } from "./start-gate.js";
import { type IdlePool, type PoolStart, RefillHold, WarmPool, type WarmPoolOptions } from "./warm-pool.js";

export interface TemplateBuildsDeps {
  readonly driver: RuntimeDriver;
  readonly templates: TemplateStore;
  readonly config: Pick<
    NodeAgentConfig,
    "poolSize" | "poolMax" | "poolWindowMs" | "poolRefill" | "poolRefillDelayMs" | "poolTemplates"
  >;
  /** Refills run as background starts, on the slots no create waits for. */
  readonly startGate: StartGate;
  readonly isDraining: () => boolean;
  readonly log: Logger;
}

/**
 * The node's built templates and their warm pools. A template is built (or found in the cache) once per agent,
 * however many creates and prebuilds ask for it meanwhile, and a warm pool starts only once its template is built:
 * the build is what tells the pool what to start.
 */
export class TemplateBuilds {
  private readonly builds = new Map<string, Promise<BuiltTemplate>>();
  private readonly pools = new Map<string, WarmPool>();

  private readonly refillHold = new RefillHold();

  constructor(private readonly deps: TemplateBuildsDeps) {}

  /** Builds the template unless cached (once per agent), then starts its warm pool when it has one. */
  ensure(templateId: string): Promise<BuiltTemplate> {
    const { driver, templates } = this.deps;
    const recipe = templates.knows(templateId) ? templates.recipe(templateId) : undefined;
    if (recipe && !driverServes(recipe, driver.name)) {
      // Never built here (WARREN_PREBUILD_TEMPLATES or a pool naming it): no sandbox of it could run.
      return Promise.reject(
        new AgentError("failed_precondition", `template '${templateId}' cannot run on the ${driver.name} driver`),
      );
    }
    let build = this.builds.get(templateId);
    if (!build) {
      build = templates
        .ensure(templateId, async (image) => {
          // An empty root has nothing to start: it is checked through the image templates stacked on it.
          if (templates.recipe(image.templateId).empty) return;
          const instance = await driver.create({
            template: image,
            resources: templates.recipe(image.templateId).defaults,
          });
          await driver.kill(instance.instanceId);
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

  /** Every warm pool's sizing and refill settings (pool-sizing.ts, warm-pool.ts); custom templates' pools too. */
  poolOptions(): WarmPoolOptions {
    const { config, startGate } = this.deps;
    const floor = config.poolSize ?? 0;
    return {
      sizing: {
        floor,
        ceiling: Math.max(floor, config.poolMax ?? floor),
        windowMs: config.poolWindowMs ?? 60_000,
      },
      refillConcurrency: config.poolRefill ?? 2,
      refillDelayMs: config.poolRefillDelayMs ?? 0,
      schedule: (start, ticket) => startGate.runBackground(start, ticket),
      scheduleForCreate: (start) => startGate.run(start),
      promote: async (instanceId) => this.deps.driver.foreground?.(instanceId),
      hold: this.refillHold,
    };
  }

  /** Runs `run` with every warm pool's refills held (RefillHold): the template pools' and custom templates'. */
  holdRefills<T>(run: () => Promise<T>): Promise<T> {
    return this.refillHold.during(run);
  }

  /** The warm pool of a template, once it exists (tests and benchmarks wait on `filled()`). */
  pool(templateId: string): WarmPool | undefined {
    return this.pools.get(templateId);
  }

  /** The pools holding ready sandboxes, with the disk each of those was promised (sandbox-creation.ts makes room). */
  idlePools(): IdlePool[] {
    return [...this.pools.values()]
      .filter((pool) => pool.readyCount > 0)
      .map((pool) => ({ pool, diskSizeMB: this.deps.templates.recipe(pool.templateId).defaults.diskSizeMB }));
  }

  /** Ready sandboxes per pooled template (the heartbeat's `pools`). */
  readyCounts(): Record<string, number> {
    const counts: Record<string, number> = {};
    for (const [id, pool] of this.pools) counts[id] = pool.readyCount;
    return counts;
  }

  /** Pools whose demand faded give their extra sandboxes back. */
  trimPools(): void {
    for (const pool of this.pools.values()) void pool.trim();
  }

  /** Stops every pool and removes its pooled sandboxes (the agent is stopping). */
  async closePools(): Promise<void> {
    for (const pool of this.pools.values()) await pool.close();
  }

  /**
   * Starts a sandbox for a warm pool: this template's, or a custom template's from one of its snapshots
   * (snapshot-pools.ts). Pooled sandboxes get E2B's default policy (internet on) up front, so most claims change
   * nothing.
   */
  startPooled(
    template: BuiltTemplate,
    resources: SandboxResources,
    start: PoolStart,
    snapshotId?: string,
  ): Promise<Instance> {
    const { driver } = this.deps;
    return driver.create({
      template,
      resources,
      labels: { pooled: "1" },
      background: start.background,
      promoted: start.promoted,
      onInstance: start.onInstance,
      ...(driver.setEgress ? { egress: OPEN_EGRESS } : {}),
      ...(snapshotId ? { snapshotId } : {}),
    });
  }

  private startPool(template: BuiltTemplate): void {
    const { driver, config } = this.deps;
    if (this.deps.isDraining() || this.pools.has(template.templateId)) return;
    const options = this.poolOptions();
    if (!config.poolTemplates.includes(template.templateId) || options.sizing.floor === 0) return;
    const pool = new WarmPool(
      template.templateId,
      options,
      (start) => this.startPooled(template, template.recipe.defaults, start),
      (instance) => driver.kill(instance.instanceId),
      this.deps.log,
    );
    this.pools.set(template.templateId, pool);
    pool.refill();
  }
}
