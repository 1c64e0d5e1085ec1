import type { Logger } from "@warren/platform/log";
import type { RuntimeDriver } from "../runtime/driver.js";
import type { BuiltTemplate } from "../templates/store.js";
import { AgentError } from "./errors.js";

interface Waiter {
  readonly rootfs: string;
  readonly resolve: (build: Record<string, unknown>) => void;
  readonly reject: (error: Error) => void;
}

/**
 * The shipped templates are made by the master's template builder, like any team's: a template the node lacks is
 * listed in its heartbeat (`templatesWanted`), the master builds it on this node from its spec
 * (templates/shipped-specs.ts) and hands over the ready snapshot (AdoptTemplate), whose layers become the
 * template's root filesystem (the driver's flattenSnapshot). Only on drivers that have one (namespace).
 */
export class ShippedFromBuilder {
  private readonly waiting = new Map<string, Waiter>();

  constructor(
    private readonly driver: RuntimeDriver,
    /** The empty `scratch` template the builder's Debian bases stack on. */
    private readonly scratch: () => Promise<BuiltTemplate>,
  ) {}

  /** The templates this node waits for (its heartbeat's `templatesWanted`). */
  wanted(): string[] {
    return [...this.waiting.keys()];
  }

  /** TemplateStore's `fromBuilder`: resolves once the master handed the template over into `rootfs`. */
  readonly build = (id: string, rootfs: string, log: Logger): Promise<Record<string, unknown>> => {
    if (this.waiting.has(id)) return Promise.reject(new Error(`template '${id}' is already awaited`));
    log.info("waiting for the master's template builder to build the template on this node");
    return new Promise((resolve, reject) => this.waiting.set(id, { rootfs, resolve, reject }));
  };

  /** The agent stops: what it still awaits fails (its build is the next agent's to ask for), so nothing hangs. */
  close(): void {
    for (const [id, waiter] of this.waiting) {
      waiter.reject(new Error(`the node agent stopped before the template builder handed '${id}' over`));
    }
    this.waiting.clear();
  }

  /** The master's AdoptTemplate: the build's ready snapshot becomes the awaited template's rootfs. */
  async adopt(templateId: string, snapshotId: string, buildId: string): Promise<void> {
    const waiter = this.waiting.get(templateId);
    if (!waiter) throw new AgentError("failed_precondition", `this node does not wait for template '${templateId}'`);
    if (!this.driver.flattenSnapshot) {
      throw new AgentError("unimplemented", `the ${this.driver.name} driver cannot take templates from the builder`);
    }
    const known = (await this.driver.listSnapshots()).some((s) => s.snapshotId === snapshotId);
    if (!known) throw new AgentError("not_found", `snapshot '${snapshotId}' is not on this node`);
    await this.driver.flattenSnapshot(snapshotId, await this.scratch(), waiter.rootfs);
    this.waiting.delete(templateId);
    waiter.resolve({ buildId, snapshotId });
  }
}
