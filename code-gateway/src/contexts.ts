import { randomUUID } from "node:crypto";
import { stat } from "node:fs/promises";
import { WorkloadCgroup } from "@warren/platform/workload";
import type { GatewayConfig } from "./config.js";
import { badRequest, internal, notFound } from "./errors.js";
import { Kernel } from "./kernels/kernel.js";
import { kernelArgv, type Language, warmUpCode } from "./kernels/languages.js";
import type { Logger } from "./log.js";

/** A context as the API shows it. */
export interface ContextInfo {
  readonly id: string;
  readonly language: Language;
  readonly cwd: string;
}

/** Releases a context's execution slot. */
export type Release = () => void;

/**
 * A stateful code context: one kernel (replaced on restart or crash) and a queue that runs
 * its executions one at a time.
 */
export class CodeContext implements ContextInfo {
  /** The current kernel; while a restart is under way, the promise of the next one. */
  kernel: Promise<Kernel>;
  /** Sandbox-global env vars applied to the current kernel; undefined until its first execution. */
  globalEnv: Readonly<Record<string, string>> | undefined;
  private queueTail: Promise<void> = Promise.resolve();
  private removed = false;

  constructor(
    readonly id: string,
    readonly language: Language,
    readonly cwd: string,
    private readonly launch: () => Promise<Kernel>,
    private readonly log: Logger,
    /** The environment every kernel of this context starts with. */
    readonly startEnv: Readonly<Record<string, string>> = {},
  ) {
    this.kernel = this.startKernel();
  }

  toJSON(): ContextInfo {
    return { id: this.id, language: this.language, cwd: this.cwd };
  }

  /** Waits for this context's turn; the caller must call the returned release exactly once. */
  async acquire(): Promise<Release> {
    let release!: Release;
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    const previous = this.queueTail;
    this.queueTail = previous.then(() => mine);
    await previous;
    return release;
  }

  /** Replaces the kernel with a fresh one (state lost). Concurrent callers share one restart. */
  restart(reason: string): Promise<Kernel> {
    const old = this.kernel;
    this.globalEnv = undefined;
    this.log.info("restarting kernel", { contextId: this.id, language: this.language, reason });
    // The old kernel stops while the new one boots: they share nothing but the cwd.
    const stopped = old.then(
      (previous) => previous.shutdown(),
      () => undefined,
    );
    // A kernel that cannot start beside the old one's processes (a fork bomb's, holding the sandbox's process
    // limit until they are reaped: ZeroMQ then cannot make its threads) is started again once they are gone.
    const next = this.startKernel().catch(async (error: unknown) => {
      await stopped;
      this.log.warn("kernel did not start beside the old one; starting it again", {
        contextId: this.id,
        language: this.language,
        error: error instanceof Error ? error.message : String(error),
      });
      return this.startKernel();
    });
    this.kernel = Promise.all([next, stopped]).then(([kernel]) => kernel);
    return this.kernel;
  }

  async close(): Promise<void> {
    this.removed = true;
    const kernel = await this.kernel.catch(() => undefined);
    await kernel?.shutdown();
  }

  private async startKernel(): Promise<Kernel> {
    const kernel = await this.launch();
    if (this.removed) {
      await kernel.shutdown();
      throw internal(`context ${this.id} was removed`);
    }
    kernel.onDeath = (death) => {
      this.log.warn("kernel died; starting a new one", { contextId: this.id, exit: death.exitDescription });
      if (!this.removed) this.restart(`kernel died (${death.exitDescription})`).catch(() => undefined);
    };
    return kernel;
  }
}

/** All contexts of this gateway, in creation order, plus the per-language defaults. */
export class ContextRegistry {
  private readonly contexts = new Map<string, CodeContext>();
  private readonly defaults = new Map<Language, Promise<CodeContext>>();
  private readonly workload: WorkloadCgroup;

  constructor(
    private readonly config: GatewayConfig,
    private readonly kernelEnv: Readonly<Record<string, string>>,
    private readonly log: Logger,
  ) {
    this.workload = new WorkloadCgroup({ procsFd: config.workloadFd, oomControlFd: undefined }, log);
  }

  async create(language: Language, cwd: string | undefined): Promise<CodeContext> {
    const directory = cwd || this.config.defaultCwd;
    const info = await stat(directory).catch(() => undefined);
    if (!info?.isDirectory()) throw badRequest(`cwd '${directory}' is not an existing directory`);
    const id = randomUUID();
    const context = new CodeContext(
      id,
      language,
      directory,
      () =>
        Kernel.start(
          {
            language,
            argv: kernelArgv(language, this.config),
            cwd: directory,
            env: this.kernelEnv,
            ...(this.config.processLimit === undefined ? {} : { processLimit: this.config.processLimit }),
            onSpawn: (pid) => this.workload.join(pid),
            warmUpCode: warmUpCode(language),
          },
          this.config.runtimeDir,
          { timeoutMs: this.config.kernelStartTimeoutMs, ceilingMs: this.config.kernelStartCeilingMs },
          this.log,
        ),
      this.log,
      this.kernelEnv,
    );
    // Listed from creation on, so GET /contexts keeps creation order even when kernels start concurrently.
    this.contexts.set(id, context);
    try {
      await context.kernel;
    } catch (error) {
      this.contexts.delete(id);
      throw internal(`failed to start a ${language} kernel: ${error instanceof Error ? error.message : error}`);
    }
    this.log.info("context created", { contextId: id, language, cwd: directory });
    return context;
  }

  /** The default context of a language, created on first use (python's and javascript's at start). */
  defaultFor(language: Language): Promise<CodeContext> {
    let context = this.defaults.get(language);
    if (!context) {
      context = this.create(language, undefined);
      this.defaults.set(language, context);
      context.catch(() => this.defaults.delete(language));
    }
    return context;
  }

  get(id: string): CodeContext {
    const context = this.contexts.get(id);
    if (!context) throw notFound(`Context ${id} not found`);
    return context;
  }

  list(): ContextInfo[] {
    return [...this.contexts.values()].map((c) => c.toJSON());
  }

  async remove(id: string): Promise<void> {
    const context = this.get(id);
    this.contexts.delete(id);
    for (const [language, entry] of this.defaults) {
      if ((await entry.catch(() => undefined)) === context) this.defaults.delete(language);
    }
    await context.close();
    this.log.info("context removed", { contextId: id });
  }

  async restart(id: string): Promise<void> {
    const context = this.get(id);
    try {
      await context.restart("requested");
    } catch (error) {
      throw internal(`failed to restart context ${id}: ${error instanceof Error ? error.message : error}`);
    }
  }

  async close(): Promise<void> {
    const pending = [...this.defaults.values()].map((p) => p.catch(() => undefined));
    await Promise.all(pending);
    await Promise.all([...this.contexts.values()].map((c) => c.close()));
    this.contexts.clear();
    this.defaults.clear();
  }
}
