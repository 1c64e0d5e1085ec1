import { randomBytes } from "node:crypto";
import type { NodeHeartbeat } from "@warren/proto/redis";
import { effectiveEgress } from "../../runtime/egress/policy.js";
import type { Db } from "../../store/db.js";
import { reservedMemoryByNode } from "../../store/nodes.js";
import { getLiveSnapshot, insertSnapshot, setSnapshotDigest, snapshotHolders } from "../../store/snapshots.js";
import { getTeam, type Team } from "../../store/teams.js";
import { getFiles } from "../../store/template-files.js";
import { findLayer, type LayerRecord, putLayer } from "../../store/template-layers.js";
import { parseBuildSpec, type TemplateBuildSpec, type TemplateStep } from "../../store/template-spec.js";
import {
  addBuildLayerKey,
  type BuildContext,
  type BuildReason,
  type BuildRecord,
  type BuildResult,
  failAbandonedBuilds,
  getBuild,
  markBuildBuilding,
  markBuildFailed,
  markBuildReady,
  touchBuild,
} from "../../store/templates.js";
import { MasterError } from "../errors.js";
import type { Logger } from "../log.js";
import type { NodeAgentClient, NodeAgentConnector } from "../node-agent-client.js";
import type { NodeRegistry } from "../node-registry.js";
import { rankNodes } from "../placement.js";
import { ensureSnapshotOn, holdersFirst } from "../snapshot-copies.js";
import type { TokenIssuer } from "../tokens.js";
import { type BuildBase, resolveBuildBase } from "./build-base.js";
import { BuildLog } from "./build-log.js";
import {
  changesFiles,
  commandEnv,
  copyPlan,
  describeStep,
  envExpansionCommand,
  envPairs,
  hashKeys,
  StepError,
  stepKey,
  userCommand,
  workdirCommand,
  workdirTarget,
} from "./build-steps.js";
import { PhaseError } from "./phase-error.js";
import { runToExit, StartReadyError, startAndAwaitReady } from "./start-ready.js";

export interface TemplateBuildConfig {
  /** Builds a node runs at once (more wait in `waiting`). */
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
}

/** Registry credentials of a build's `fromImage`, from the trigger (never stored). */
export interface RegistryLogin {
  readonly username: string;
  readonly password: string;
}

const HEARTBEAT_MS = 10_000;

/**
 * Runs template builds (E2B's v2 build flow) in a build sandbox on a node: every step through the sandbox's envd,
 * each result kept as an immutable files-only snapshot layer cached by E2B's key chain, then the start and ready
 * commands and the ready snapshot (with memory where the node's driver keeps it). Status and logs go to
 * PostgreSQL, where the api serves them. A failed build removes its sandbox; completed steps stay cached.
 */
export class TemplateBuilder {
  private readonly running = new Map<string, AbortController>();
  private readonly perNode = new Map<string, number>();

  constructor(private readonly deps: TemplateBuilderDeps) {}

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
    const sandboxId = `b${buildId.replaceAll("-", "")}`;
    const marked = await markBuildBuilding(db, buildId, sandboxId, tokens.newNonce());
    if (!marked) throw new MasterError("conflict", `build '${buildId}' is not in waiting state`);
    const abort = new AbortController();
    this.running.set(buildId, abort);
    void this.run(marked, abort, credentials).finally(() => this.running.delete(buildId));
  }

  /** Cancels builds running here (master shutdown): each ends in `error`. */
  async stop(): Promise<void> {
    for (const abort of this.running.values()) abort.abort(new Error("build was cancelled (the master stopped)"));
    const deadline = Date.now() + 15_000;
    while (this.running.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  }

  /** Leader loop: builds whose master stopped mid-build (no heartbeat) are failed and their sandboxes removed. */
  async failAbandoned(): Promise<void> {
    const failed = await failAbandonedBuilds(this.deps.db, HEARTBEAT_MS * 6);
    for (const build of failed) {
      this.deps.log.warn("template build abandoned by its master; failed", { buildId: build.id });
      if (build.buildSandboxId) await this.removeSandboxEverywhere(build.buildSandboxId);
    }
  }

  private async run(build: BuildRecord, abort: AbortController, credentials?: RegistryLogin): Promise<void> {
    const { db, log } = this.deps;
    const started = Date.now();
    const buildLog = new BuildLog(db, build.id);
    const timer = setTimeout(() => abort.abort(new Error("build timed out")), this.deps.config.timeoutMs);
    const heartbeat = setInterval(() => void touchBuild(db, build.id).catch(() => undefined), HEARTBEAT_MS);
    let placed: { node: NodeAgentClient; nodeId: string } | undefined;
    const sandboxId = build.buildSandboxId as string;
    let outcome: { result: BuildResult } | { reason: BuildReason };
    try {
      const spec = parseBuildSpec(build.spec);
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
      buildLog.add("error", `Build failed: ${reason.message}`, reason.step);
    }
    clearTimeout(timer);
    // The status changes last: when a client sees `ready` or `error`, the log is whole and the sandbox gone.
    if (placed) {
      await this.removeSandbox(placed.node, sandboxId);
      this.perNode.set(placed.nodeId, (this.perNode.get(placed.nodeId) ?? 1) - 1);
    }
    await buildLog.flush().catch((error) => log.warn("writing build logs failed", { buildId: build.id, error }));
    clearInterval(heartbeat);
    const seconds = Math.round((Date.now() - started) / 100) / 10;
    if ("result" in outcome && (await markBuildReady(db, build.id, outcome.result))) {
      log.info("template build ready", { buildId: build.id, templateId: build.templateId, seconds });
      return;
    }
    const reason = "reason" in outcome ? outcome.reason : { message: "build was cancelled" };
    await markBuildFailed(db, build.id, reason).catch(() => undefined);
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
    onPlaced: (placed: { node: NodeAgentClient; nodeId: string }) => void,
  ): Promise<BuildResult> {
    const { db, tokens } = this.deps;
    const base = await resolveBuildBase(
      { ...this.deps, reachable: (snapshotId) => this.reachable(snapshotId) },
      { team, spec, build, credentials, buildLog },
    );
    buildLog.info(`[base] ${base.description} [${base.key.slice(0, 12)}]`, "base");
    const defaultUserKey = hashKeys(base.key, "DEFAULT USER", "user");
    const steps = spec.steps;
    const keys: string[] = [];
    let previous = defaultUserKey;
    for (const step of steps) {
      previous = stepKey(previous, step);
      keys.push(previous);
    }
    // The longest cached prefix; `force` (the build's, or a step's) rebuilds from there on.
    let cached: LayerRecord | undefined;
    let firstToRun = 0;
    if (!spec.force) {
      for (let i = 0; i < steps.length; i++) {
        if (steps[i]?.force) break;
        const layer = await findLayer(db, team.id, keys[i] as string);
        // A layer whose node is gone (and that was never published) is a miss: it is built again here.
        if (!layer || !(await this.reachable(layer.snapshotId))) break;
        cached = layer;
        firstToRun = i + 1;
        buildLog.info(
          `CACHED [builder ${i + 1}/${steps.length}] ${describeStep(steps[i] as TemplateStep)}`,
          `${i + 1}`,
        );
        await addBuildLayerKey(db, build.id, layer.key);
      }
    }
    let context: BuildContext = cached?.context ?? base.context;
    let snapshot = cached ? { id: cached.snapshotId, nodeId: cached.nodeId } : base.snapshot;
    const startCmd = spec.startCmd ?? base.startCmd;
    const readyCmd = spec.startCmd || spec.readyCmd ? (spec.readyCmd ?? null) : base.readyCmd;
    const needsSandbox = firstToRun < steps.length || startCmd !== null || readyCmd !== null;
    let placed: { node: NodeAgentClient; nodeId: string } | undefined;
    let finalSnapshot = snapshot;
    let memory = false;
    if (needsSandbox) {
      const token = tokens.envdToken(build.buildSandboxId as string, build.tokenNonce as string);
      placed = await this.startBuildSandbox(build, team, base, snapshot);
      onPlaced(placed);
      const run = { node: placed.node, sandboxId: build.buildSandboxId as string, token, signal, buildLog };
      for (let i = firstToRun; i < steps.length; i++) {
        const step = steps[i] as TemplateStep;
        const phase = `${i + 1}`;
        const prefix = `builder ${i + 1}/${steps.length}`;
        buildLog.info(`[${prefix}] ${describeStep(step)} [${(keys[i] as string).slice(0, 12)}]`, phase);
        try {
          context = await this.runStep(run, step, context, team, prefix, phase, i);
        } catch (error) {
          if (signal.aborted) throw error;
          throw new PhaseError(phase, (error as Error).message);
        }
        if (changesFiles(step) || !snapshot) {
          snapshot = await this.capture(build, placed, context, "layer", { layerKey: keys[i] as string });
        }
        await putLayer(db, team.id, {
          key: keys[i] as string,
          snapshotId: snapshot.id,
          nodeId: snapshot.nodeId,
          context,
        });
        await addBuildLayerKey(db, build.id, keys[i] as string);
      }
      finalSnapshot = snapshot;
      if (snapshot) await this.publish(placed, snapshot.id, build, "layer", buildLog);
      if (startCmd !== null || readyCmd !== null) {
        buildLog.info(`[finalize] start: ${startCmd ?? "(none)"}; ready: ${readyCmd ?? "(default)"}`, "finalize");
        try {
          await startAndAwaitReady({
            node: placed.node,
            sandboxId: run.sandboxId,
            envdAccessToken: token,
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
        const made = await this.capture(build, placed, context, "template", { templateBuild: build.id });
        finalSnapshot = { id: made.id, nodeId: placed.nodeId };
        memory = made.memory;
        await this.publish(placed, made.id, build, "template", buildLog);
        buildLog.info(
          `[finalize] ready snapshot taken (${memory ? "memory and files: sandboxes continue the start process" : "files only: sandboxes run the start command at create"})`,
          "finalize",
        );
      }
    }
    if (!placed && snapshot) {
      // Every step was cached and nothing starts: the template is the cached layer, published from a holder.
      const row = await getLiveSnapshot(db, snapshot.id);
      const holders = row ? await snapshotHolders(db, row) : new Set<string>();
      const holder = (await this.deps.registry.liveNodes()).find((n) => holders.has(n.nodeId));
      if (row && !row.digest && holder) {
        await this.publish(
          { node: this.deps.nodeAgent(holder.nodeId, holder.addr), nodeId: holder.nodeId },
          row.id,
          build,
          "layer",
          buildLog,
        );
      }
    }
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

  /** The node and the build sandbox: where the starting layer is, else the best node for the node template. */
  private async startBuildSandbox(
    build: BuildRecord,
    team: Team,
    base: BuildBase,
    snapshot: { id: string; nodeId: string } | undefined,
  ): Promise<{ node: NodeAgentClient; nodeId: string }> {
    const { registry, nodeAgent, tokens, config } = this.deps;
    // The starting layer's holders first; a published one may go to any node of its driver (which pulls it).
    const layer = snapshot ? await getLiveSnapshot(this.deps.db, snapshot.id) : undefined;
    if (snapshot && !layer) throw new PhaseError("base", `the base layer ${snapshot.id} no longer exists`);
    const holders = layer ? await snapshotHolders(this.deps.db, layer) : undefined;
    const [nodes, reserved] = await Promise.all([registry.placeableNodes(), reservedMemoryByNode(this.deps.db)]);
    const ranked = holdersFirst(
      rankNodes(
        nodes.filter((n) => !layer || holders?.has(n.nodeId) || (layer.digest !== null && n.driver === layer.driver)),
        reserved,
        { templateId: base.nodeTemplateId, memoryMB: build.memoryMB },
        { memoryOvercommit: this.deps.memoryOvercommit },
      ),
      holders,
    );
    const node: NodeHeartbeat | undefined =
      ranked.find((n) => (this.perNode.get(n.nodeId) ?? 0) < config.maxConcurrentPerNode) ?? ranked[0];
    if (!node) {
      throw new PhaseError(
        "base",
        layer
          ? `no node holding the base layer (${[...(holders ?? [])].join(", ")}) can take a build now`
          : `no node can run template '${base.nodeTemplateId}' now`,
      );
    }
    if (layer) {
      try {
        await ensureSnapshotOn(this.deps, layer, node, holders);
      } catch (error) {
        throw new PhaseError(
          "base",
          `the base layer could not be brought to node ${node.nodeId}: ${(error as Error).message}`,
        );
      }
    }
    const client = nodeAgent(node.nodeId, node.addr);
    this.perNode.set(node.nodeId, (this.perNode.get(node.nodeId) ?? 0) + 1);
    const sandboxId = build.buildSandboxId as string;
    try {
      await client.create({
        sandboxId,
        teamId: team.id,
        templateId: base.nodeTemplateId,
        resources: { cpuCount: build.cpuCount, memoryMB: build.memoryMB, diskSizeMB: config.diskMB },
        envVars: {},
        envdAccessToken: tokens.envdToken(sandboxId, build.tokenNonce as string),
        trafficTokenHash: randomBytes(32).toString("hex"),
        publicTraffic: false,
        autoResume: false,
        metadata: { "warren.templateBuild": build.id },
        // Build steps reach what the team's sandboxes may reach (E2B's default: the internet), never more.
        egress: effectiveEgress(null, null, team.egressMode),
        ...(snapshot ? { snapshotId: snapshot.id } : {}),
        defaultUser: "root",
        defaultWorkdir: "/",
      });
    } catch (error) {
      this.perNode.set(node.nodeId, (this.perNode.get(node.nodeId) ?? 1) - 1);
      throw new PhaseError("base", `the build sandbox did not start: ${(error as Error).message}`);
    }
    return { node: client, nodeId: node.nodeId };
  }

  private async runStep(
    run: { node: NodeAgentClient; sandboxId: string; token: string; signal: AbortSignal; buildLog: BuildLog },
    step: TemplateStep,
    context: BuildContext,
    team: Team,
    prefix: string,
    phase: string,
    index: number,
  ): Promise<BuildContext> {
    const exec = async (command: string, user: string, cwd: string | null, log = true) => {
      const output = run.buildLog.output(prefix, phase);
      const exit = await runToExit(
        run.node.runCommand(
          run.sandboxId,
          run.token,
          // No workdir: the user's home, as E2B's envd does (`~` is the running user's).
          { command, user, cwd: cwd ?? "~", env: commandEnv(context), timeoutMs: 3_600_000 },
          run.signal,
        ),
        log ? (stream, data) => output.write(stream, data) : undefined,
      ).finally(() => output.end());
      if (exit.exitCode !== 0) throw new StepError(`${exit.status || `exit status ${exit.exitCode}`}`);
      return exit.stdout;
    };
    switch (step.type) {
      case "RUN": {
        const [command = "", user] = step.args;
        if (command.trim() === "") throw new StepError("RUN needs a command");
        try {
          await exec(command, user || context.user, context.workdir);
        } catch (error) {
          // E2B's wording: "failed to run command '<cmd>': exit status 1" or "…: command failed: <code>: <why>".
          if (error instanceof StepError) throw new StepError(`failed to run command '${command}': ${error.message}`);
          if (run.signal.aborted) throw error;
          throw new StepError(`failed to run command '${command}': command failed: ${connectReason(error)}`);
        }
        return context;
      }
      case "ENV": {
        const env = { ...context.env };
        for (const [name, value] of envPairs(step))
          env[name] = await exec(envExpansionCommand(value), "root", null, false);
        return { ...context, env };
      }
      case "WORKDIR": {
        const target = workdirTarget(context, step.args[0] ?? "");
        const workdir = (await exec(workdirCommand(target, context.user), "root", null, false)).trim();
        return { ...context, workdir: workdir || target };
      }
      case "USER": {
        const name = step.args[0] ?? "";
        await exec(userCommand(name), "root", null);
        return { ...context, user: name };
      }
      case "COPY": {
        const plan = copyPlan(step, context, `${index}-${randomBytes(4).toString("hex")}`);
        const archive = await getFiles(this.deps.db, team.id, step.filesHash as string);
        if (!archive)
          throw new StepError(`the files of COPY ${step.args[0]} (hash ${step.filesHash}) were never uploaded`);
        await run.node.writeFile(run.sandboxId, run.token, plan.archivePath, archive);
        await exec(plan.command, "root", null);
        return context;
      }
    }
  }

  /** Whether a snapshot can still be used: a live node holds it, or it was published to the store. */
  private async reachable(snapshotId: string): Promise<boolean> {
    const row = await getLiveSnapshot(this.deps.db, snapshotId);
    if (!row) return false;
    if (row.digest) return true;
    const holders = await snapshotHolders(this.deps.db, row);
    return (await this.deps.registry.liveNodes()).some((n) => holders.has(n.nodeId));
  }

  /**
   * Publishes a build's snapshot to the cluster's store, so any node of the driver can start sandboxes (or child
   * builds) from it; a failure fails the build (nothing a user relies on may live on one node's disk only).
   */
  private async publish(
    placed: { node: NodeAgentClient; nodeId: string },
    snapshotId: string,
    build: BuildRecord,
    kind: "template" | "layer",
    buildLog: BuildLog,
  ): Promise<void> {
    const row = await getLiveSnapshot(this.deps.db, snapshotId);
    if (row?.digest) return;
    let published: { digest: string; sizeBytes: number };
    try {
      published = await placed.node.publishSnapshot(snapshotId, {
        "dev.warren.kind": kind,
        "dev.warren.template": build.templateId,
        "dev.warren.build": build.id,
      });
    } catch (error) {
      throw new PhaseError("finalize", `publishing the ${kind} to the store failed: ${(error as Error).message}`);
    }
    await setSnapshotDigest(this.deps.db, snapshotId, published.digest);
    buildLog.info(
      `[finalize] ${kind === "template" ? "ready snapshot" : "filesystem"} published to the store (${published.digest.slice(0, 19)}…, ${Math.round(published.sizeBytes / 2 ** 20)} MiB)`,
      "finalize",
    );
  }

  /**
   * Snapshots the build sandbox and records the snapshot (so the node sweep keeps it): a step's `layer` (files
   * only) or the ready `template` (memory where the node's driver keeps it).
   */
  private async capture(
    build: BuildRecord,
    placed: { node: NodeAgentClient; nodeId: string },
    context: BuildContext,
    kind: "layer" | "template",
    metadata: Record<string, string>,
  ): Promise<{ id: string; nodeId: string; memory: boolean }> {
    const id = `${kind === "layer" ? "l" : "t"}${randomBytes(10).toString("hex")}`;
    const made = await placed.node.snapshot(build.buildSandboxId as string, id, { filesOnly: kind === "layer" });
    await insertSnapshot(this.deps.db, {
      id,
      teamId: build.teamId,
      name: null,
      kind,
      sourceSandboxId: build.buildSandboxId as string,
      nodeId: placed.nodeId,
      templateId: made.templateId,
      driver: made.driver,
      memory: made.memory,
      sizeBytes: made.sizeBytes,
      cpuCount: build.cpuCount,
      memoryMB: build.memoryMB,
      diskSizeMB: this.deps.config.sandboxDiskMB,
      envVars: { ...context.env },
      metadata,
    });
    return { id, nodeId: placed.nodeId, memory: made.memory };
  }

  private async removeSandbox(node: NodeAgentClient, sandboxId: string): Promise<void> {
    await node.kill(sandboxId).catch((error) => {
      if ((error as { kind?: string }).kind !== "not_found") {
        this.deps.log.warn("removing a build sandbox failed", { sandboxId, error: String(error) });
      }
    });
  }

  private async removeSandboxEverywhere(sandboxId: string): Promise<void> {
    for (const node of await this.deps.registry.liveNodes()) {
      await this.removeSandbox(this.deps.nodeAgent(node.nodeId, node.addr), sandboxId);
    }
  }
}

/** A node call's failure as E2B words one: `unauthenticated: invalid username: 'x'`. */
function connectReason(error: unknown): string {
  const message = (error as Error).message ?? String(error);
  const match = /^([A-Z][A-Za-z]+): (.*)$/s.exec(message.replace(/^failed: /, ""));
  if (!match) return message;
  const code = (match[1] as string).replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
  return `${code}: ${match[2]}`;
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
