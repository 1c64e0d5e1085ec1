import type { Db } from "../../store/db.js";
import { getTeam, type Team } from "../../store/teams.js";
import { findLayer, type LayerRecord, putLayer } from "../../store/template-layers.js";
import { parseStoredBuildSpec, type TemplateBuildSpec, type TemplateStep } from "../../store/template-spec.js";
import {
  abandonedBuilds,
  addBuildLayerKey,
  type BuildContext,
  type BuildReason,
  type BuildRecord,
  type BuildResult,
  failAbandonedBuild,
  getBuild,
  handOffBuild,
  markBuildBuilding,
  markBuildFailed,
  markBuildReady,
  takeOverBuild,
  touchBuild,
} from "../../store/templates.js";
import { MasterError } from "../errors.js";
import type { Logger } from "../log.js";
import type { NodeAgentConnector } from "../node-agent-client.js";
import type { NodeRegistry } from "../node-registry.js";
import type { TokenIssuer } from "../tokens.js";
import { resolveBuildBase } from "./build-base.js";
import { BuildLog } from "./build-log.js";
import { BuildSandboxes, type PlacedBuild } from "./build-sandbox.js";
import { BuildSnapshots } from "./build-snapshots.js";
import { runBuildStep, type StepSandbox } from "./build-step-runner.js";
import { changesFiles, describeStep, hashKeys, StepError, stepKey } from "./build-steps.js";
import { PhaseError } from "./phase-error.js";
import { StartReadyError, startAndAwaitReady } from "./start-ready.js";

export interface TemplateBuildConfig {
  /** Builds a node runs at once (more wait in the master's queue, `building`, within their deadline). */
  readonly maxConcurrentPerNode: number;
  /** A build still running after this fails with "build timed out". */
  readonly timeoutMs: number;
  /** The build sandbox's writable disk (MiB): the most a build's steps may write. */
  readonly diskMB: number;
  /** The default writable disk (MiB) of sandboxes from a built template. */
  readonly sandboxDiskMB: number;
}

export interface TemplateBuilderDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly tokens: TokenIssuer;
  readonly log: Logger;
  readonly config: TemplateBuildConfig;
  readonly memoryOvercommit: number;
  /** This master's liveness lock key (master/liveness.ts), recorded on the builds it runs. */
  readonly masterLock?: number;
}

/** Registry credentials of a build's `fromImage`, from the trigger (never stored). */
export interface RegistryLogin {
  readonly username: string;
  readonly password: string;
}

const HEARTBEAT_MS = 10_000;
/** A build whose row has not changed for this long was abandoned by its master. */
const ABANDONED_AFTER_MS = HEARTBEAT_MS * 6;
/** A build is continued by another master at most this often (a build that kills its masters must end). */
const MAX_TAKEOVERS = 2;

/** Why a run ends without a result: its master stops and hands the build to another. */
class HandOff extends Error {
  constructor() {
    super("the master running this build stopped");
  }
}

/**
 * Why a run ends without a result: the build is no longer this run's — another master took it over (this run was
 * taken for dead), or it ended meanwhile (its template was deleted).
 */
class TakenOver extends Error {
  constructor() {
    super("the build is no longer this run's");
  }
}

/** Where a build's steps left off: the context and the layer the next step starts from. */
interface BuildState {
  readonly context: BuildContext;
  readonly snapshot: { readonly id: string; readonly nodeId: string } | undefined;
}

/**
 * Runs template builds (E2B's v2 build flow) in a build sandbox on a node: every step through the sandbox's envd,
 * each result kept as an immutable files-only snapshot layer cached by E2B's key chain, then the start and ready
 * commands and the ready snapshot (with memory where the node's driver keeps it). Status and logs go to
 * PostgreSQL, where the api serves them. A failed build removes its sandbox; completed steps stay cached.
 */
export class TemplateBuilder {
  private readonly running = new Map<string, AbortController>();
  private stopping = false;
  private readonly sandboxes: BuildSandboxes;
  private readonly snapshots: BuildSnapshots;

  constructor(private readonly deps: TemplateBuilderDeps) {
    this.sandboxes = new BuildSandboxes(deps);
    this.snapshots = new BuildSnapshots(deps);
  }

  /** Starts a waiting build in the background; resolves once it is `building`. */
  async start(teamId: string, templateId: string, buildId: string, credentials?: RegistryLogin): Promise<void> {
    const { db, tokens } = this.deps;
    const build = await getBuild(db, buildId);
    if (!build || build.teamId !== teamId || build.templateId !== templateId) {
      throw new MasterError("not_found", `Build '${buildId}' not found`);
    }
    if (build.status !== "waiting" || !build.spec) {
      throw new MasterError("conflict", `build '${buildId}' is not in waiting state (it is ${build.status})`);
    }
    const sandboxId = buildSandboxId(buildId, 0);
    const marked = await markBuildBuilding(db, buildId, sandboxId, tokens.newNonce(), this.deps.masterLock ?? null);
    if (!marked) throw new MasterError("conflict", `build '${buildId}' is not in waiting state`);
    const abort = new AbortController();
    this.running.set(buildId, abort);
    void this.run(marked, abort, credentials).finally(() => this.running.delete(buildId));
  }

  /**
   * Master shutdown: every build running here stops and is handed over (its sandbox removed, its row stale at
   * once), so the leader gives it to a master that continues it from its cached steps.
   */
  async stop(): Promise<void> {
    // This master's leader loop must not take back what it hands over.
    this.stopping = true;
    for (const abort of this.running.values()) abort.abort(new HandOff());
    const deadline = Date.now() + 15_000;
    while (this.running.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  }

  /**
   * Leader loop: a build whose master stopped (handed over, died: its liveness lock is gone, or no heartbeat for a
   * minute: a master cut off from PostgreSQL) is continued here from
   * its stored spec; its completed steps are cached layers, so only the step that was running and the later ones
   * run again. One that needs registry credentials (never stored) or was continued too often fails instead.
   */
  async recoverAbandoned(): Promise<void> {
    const { db, log, tokens } = this.deps;
    if (this.stopping) return;
    for (const build of await abandonedBuilds(db, ABANDONED_AFTER_MS)) {
      if (this.running.has(build.id)) continue;
      const cannot = !build.spec
        ? "it has no stored spec"
        : (build.spec as { fromImageRegistry?: unknown }).fromImageRegistry
          ? "its registry credentials are never stored"
          : build.takeovers >= MAX_TAKEOVERS
            ? `it was continued ${build.takeovers} times already`
            : undefined;
      if (cannot) {
        const message = `An internal error occurred: the build was interrupted (its master stopped) and cannot be continued (${cannot}). Please try again.`;
        if (await failAbandonedBuild(db, build.id, ABANDONED_AFTER_MS, message)) {
          log.warn("template build abandoned by its master; failed", { buildId: build.id, why: cannot });
          if (build.buildSandboxId) await this.sandboxes.removeEverywhere(build.buildSandboxId);
        }
        continue;
      }
      const sandboxId = buildSandboxId(build.id, build.takeovers + 1);
      const taken = await takeOverBuild(
        db,
        build.id,
        ABANDONED_AFTER_MS,
        sandboxId,
        tokens.newNonce(),
        this.deps.masterLock ?? null,
      );
      if (!taken) continue;
      // The old run's sandbox (its master may have died before removing it) goes first: it holds a build slot.
      if (build.buildSandboxId) await this.sandboxes.removeEverywhere(build.buildSandboxId);
      log.info("template build continued after its master stopped", { buildId: build.id, takeover: taken.takeovers });
      const abort = new AbortController();
      this.running.set(build.id, abort);
      void this.run(taken, abort).finally(() => this.running.delete(build.id));
    }
  }

  private async run(build: BuildRecord, abort: AbortController, credentials?: RegistryLogin): Promise<void> {
    const { db, log } = this.deps;
    const started = Date.now();
    const nonce = build.tokenNonce as string;
    const buildLog = build.takeovers > 0 ? await BuildLog.continuing(db, build.id) : new BuildLog(db, build.id);
    // A continued build keeps its deadline (counted from its creation, a little before its first start).
    const timeoutMs =
      build.takeovers > 0
        ? Math.max(0, this.deps.config.timeoutMs - (started - build.createdAt.getTime()))
        : this.deps.config.timeoutMs;
    const timer = setTimeout(() => abort.abort(new Error("build timed out")), timeoutMs);
    const heartbeat = setInterval(() => {
      void touchBuild(db, build.id, nonce).then(
        (ours) => {
          if (!ours && !abort.signal.aborted) abort.abort(new TakenOver());
        },
        () => undefined,
      );
    }, HEARTBEAT_MS);
    let placed: PlacedBuild | undefined;
    const sandboxId = build.buildSandboxId as string;
    let outcome: { result: BuildResult } | { reason: BuildReason };
    if (build.takeovers > 0) {
      buildLog.info(
        `[base] the master running this build stopped; another master continues it (takeover ${build.takeovers} of at most ${MAX_TAKEOVERS}, cached steps are reused)`,
        "base",
      );
    }
    try {
      const spec = parseStoredBuildSpec(build.spec);
      const team = await getTeam(db, build.teamId);
      if (!team) throw new PhaseError("base", "the build's team no longer exists");
      const result = await this.execute(build, spec, team, buildLog, abort.signal, credentials, (p) => {
        placed = p;
      });
      outcome = { result };
      buildLog.info(`Build finished, took ${Math.round((Date.now() - started) / 100) / 10}s`);
    } catch (error) {
      const reason = failureReason(error, abort.signal);
      outcome = { reason };
      const continues = abort.signal.reason instanceof HandOff || abort.signal.reason instanceof TakenOver;
      if (!continues) buildLog.add("error", `Build failed: ${reason.message}`, reason.step);
    }
    clearTimeout(timer);
    clearInterval(heartbeat);
    const stoppedBy = abort.signal.reason;
    if (stoppedBy instanceof TakenOver) {
      // Another master runs it now, in a sandbox of its own; this run's log lines and result are not the build's.
      if (placed) await this.sandboxes.release(placed, sandboxId);
      log.warn("template build no longer this run's (taken over, or its template deleted); this run stops", {
        buildId: build.id,
      });
      return;
    }
    // The status changes last: when a client sees `ready` or `error`, the log is whole and the sandbox gone.
    if (placed) await this.sandboxes.release(placed, sandboxId);
    if (stoppedBy instanceof HandOff && !("result" in outcome)) {
      buildLog.info("[base] this master is stopping; the build goes to another master", "base");
      await buildLog.flush().catch((error) => log.warn("writing build logs failed", { buildId: build.id, error }));
      await handOffBuild(db, build.id, nonce).catch(() => undefined);
      log.info("template build handed over (the master is stopping)", { buildId: build.id });
      return;
    }
    await buildLog.flush().catch((error) => log.warn("writing build logs failed", { buildId: build.id, error }));
    const seconds = Math.round((Date.now() - started) / 100) / 10;
    if ("result" in outcome && (await markBuildReady(db, build.id, outcome.result, nonce))) {
      log.info("template build ready", { buildId: build.id, templateId: build.templateId, seconds });
      return;
    }
    const reason = "reason" in outcome ? outcome.reason : { message: "build was cancelled" };
    await markBuildFailed(db, build.id, reason, nonce).catch(() => undefined);
    log.warn("template build failed", { buildId: build.id, templateId: build.templateId, seconds, ...reason });
  }

  /** The whole build up to its result; `onPlaced` says where its sandbox runs (the caller removes it). */
  private async execute(
    build: BuildRecord,
    spec: TemplateBuildSpec,
    team: Team,
    buildLog: BuildLog,
    signal: AbortSignal,
    credentials: RegistryLogin | undefined,
    onPlaced: (placed: PlacedBuild) => void,
  ): Promise<BuildResult> {
    const base = await resolveBuildBase(
      { ...this.deps, reachable: (snapshotId) => this.snapshots.reachable(snapshotId) },
      { team, spec, build, credentials, buildLog },
    );
    buildLog.info(`[base] ${base.description} [${base.key.slice(0, 12)}]`, "base");
    const steps = spec.steps;
    const keys: string[] = [];
    let previous = hashKeys(base.key, "DEFAULT USER", "user");
    for (const step of steps) {
      previous = stepKey(previous, step);
      keys.push(previous);
    }
    const { cached, firstToRun } = await this.cachedPrefix(build, spec, team, keys, buildLog);
    let context: BuildContext = cached?.context ?? base.context;
    let snapshot = cached ? { id: cached.snapshotId, nodeId: cached.nodeId } : base.snapshot;
    const startCmd = spec.startCmd ?? base.startCmd;
    const readyCmd = spec.startCmd || spec.readyCmd ? (spec.readyCmd ?? null) : base.readyCmd;
    const needsSandbox = firstToRun < steps.length || startCmd !== null || readyCmd !== null;
    let placed: PlacedBuild | undefined;
    let finalSnapshot = snapshot;
    if (needsSandbox) {
      const token = this.deps.tokens.envdToken(build.buildSandboxId as string, build.tokenNonce as string);
      placed = await this.sandboxes.start(build, team, base, snapshot, { signal, buildLog });
      onPlaced(placed);
      const sandbox: StepSandbox = {
        node: placed.node,
        sandboxId: build.buildSandboxId as string,
        token,
        signal,
        buildLog,
      };
      const plan = { steps, keys, firstToRun };
      ({ context, snapshot } = await this.runSteps(sandbox, placed, build, team, plan, { context, snapshot }));
      finalSnapshot = snapshot;
      if (snapshot) await this.snapshots.publish(placed, snapshot.id, build, "layer", buildLog);
      if (startCmd !== null || readyCmd !== null) {
        finalSnapshot = await this.finalize(sandbox, placed, build, context, startCmd, readyCmd);
      }
    }
    // Every step was cached and nothing starts: the template is the cached layer, published from a holder.
    if (!placed && snapshot) await this.snapshots.publishFromHolder(snapshot.id, build, buildLog);
    return {
      nodeId: finalSnapshot?.nodeId ?? "",
      snapshotId: finalSnapshot?.id ?? "",
      layerSnapshotId: snapshot?.id ?? "",
      baseTemplateId: base.nodeTemplateId,
      startCmd,
      readyCmd,
      context,
      layerKeys: keys,
      diskSizeMB: this.deps.config.sandboxDiskMB,
    };
  }

  /** The longest cached prefix of the steps; `force` (the build's, or a step's) rebuilds from there on. */
  private async cachedPrefix(
    build: BuildRecord,
    spec: TemplateBuildSpec,
    team: Team,
    keys: readonly string[],
    buildLog: BuildLog,
  ): Promise<{ cached: LayerRecord | undefined; firstToRun: number }> {
    const steps = spec.steps;
    let cached: LayerRecord | undefined;
    let firstToRun = 0;
    if (spec.force) return { cached, firstToRun };
    for (let i = 0; i < steps.length; i++) {
      if (steps[i]?.force) break;
      const layer = await findLayer(this.deps.db, team.id, keys[i] as string);
      // A layer whose node is gone (and that was never published) is a miss: it is built again here.
      if (!layer || !(await this.snapshots.reachable(layer.snapshotId))) break;
      cached = layer;
      firstToRun = i + 1;
      buildLog.info(`CACHED [builder ${i + 1}/${steps.length}] ${describeStep(steps[i] as TemplateStep)}`, `${i + 1}`);
      await addBuildLayerKey(this.deps.db, build.id, layer.key);
    }
    return { cached, firstToRun };
  }

  /**
   * Runs the steps from `firstToRun` in the build sandbox; after each one that changes files (or when there is no
   * layer yet) a files-only snapshot, cached under the step's key. Resolves with the last context and layer.
   */
  private async runSteps(
    sandbox: StepSandbox,
    placed: PlacedBuild,
    build: BuildRecord,
    team: Team,
    { steps, keys, firstToRun }: { steps: readonly TemplateStep[]; keys: readonly string[]; firstToRun: number },
    from: BuildState,
  ): Promise<BuildState> {
    const { db } = this.deps;
    let { context, snapshot } = from;
    for (let i = firstToRun; i < steps.length; i++) {
      const step = steps[i] as TemplateStep;
      const phase = `${i + 1}`;
      const prefix = `builder ${i + 1}/${steps.length}`;
      sandbox.buildLog.info(`[${prefix}] ${describeStep(step)} [${(keys[i] as string).slice(0, 12)}]`, phase);
      try {
        context = await runBuildStep(db, sandbox, { step, context, teamId: team.id, prefix, phase, index: i });
      } catch (error) {
        if (sandbox.signal.aborted) throw error;
        throw new PhaseError(phase, (error as Error).message);
      }
      if (changesFiles(step) || !snapshot) {
        snapshot = await this.snapshots.capture(build, placed, context, "layer", { layerKey: keys[i] as string });
      }
      await putLayer(db, team.id, {
        key: keys[i] as string,
        snapshotId: snapshot.id,
        nodeId: snapshot.nodeId,
        context,
      });
      await addBuildLayerKey(db, build.id, keys[i] as string);
    }
    return { context, snapshot };
  }

  /** The start and ready commands, then the ready snapshot (the build's result), published. */
  private async finalize(
    sandbox: StepSandbox,
    placed: PlacedBuild,
    build: BuildRecord,
    context: BuildContext,
    startCmd: string | null,
    readyCmd: string | null,
  ): Promise<{ id: string; nodeId: string }> {
    const { buildLog, signal } = sandbox;
    buildLog.info(`[finalize] start: ${startCmd ?? "(none)"}; ready: ${readyCmd ?? "(default)"}`, "finalize");
    try {
      await startAndAwaitReady({
        node: placed.node,
        sandboxId: sandbox.sandboxId,
        envdAccessToken: sandbox.token,
        context,
        startCmd,
        readyCmd,
        signal,
        output: (source) => buildLog.output(`finalize ${source}`, "finalize"),
      });
    } catch (error) {
      if (signal.aborted) throw error;
      throw new PhaseError("finalize", (error as Error).message);
    }
    const made = await this.snapshots.capture(build, placed, context, "template", { templateBuild: build.id });
    await this.snapshots.publish(placed, made.id, build, "template", buildLog);
    buildLog.info(
      `[finalize] ready snapshot taken (${made.memory ? "memory and files: sandboxes continue the start process" : "files only: sandboxes run the start command at create"})`,
      "finalize",
    );
    return { id: made.id, nodeId: placed.nodeId };
  }
}

/** The build sandbox of a build's run: its first, or the one of its `takeover`th continuation. */
function buildSandboxId(buildId: string, takeover: number): string {
  return `b${buildId.replaceAll("-", "")}${takeover > 0 ? `t${takeover}` : ""}`;
}

function failureReason(error: unknown, signal: AbortSignal): BuildReason {
  if (signal.aborted) {
    const why = signal.reason instanceof Error ? signal.reason.message : "build was cancelled";
    return { message: why };
  }
  if (error instanceof PhaseError) return { message: error.message, ...(error.step ? { step: error.step } : {}) };
  if (error instanceof StepError || error instanceof StartReadyError) return { message: error.message };
  return {
    message: `An internal error occurred: ${(error as Error).message ?? String(error)}. Please try again.`,
  };
}
