import type { SandboxRow } from "../store/sandboxes.js";
import { AutoResume } from "./auto-resume.js";
import { MasterError, notFound } from "./errors.js";
import { DEFAULT_TIMEOUT_SECONDS, type LifecycleDeps } from "./lifecycle-deps.js";
import type { SandboxLogLine } from "./node-agent-client.js";
import { PauseAndResume } from "./pause-resume.js";
import { RecentPlacements } from "./placement.js";
import { type CreateInput, SandboxCreation } from "./sandbox-creation.js";
import { SandboxSettings } from "./sandbox-settings.js";
import { transition } from "./sandbox-transition.js";
import { SandboxTermination } from "./termination.js";

export type { LifecycleConfig, LifecycleDeps } from "./lifecycle-deps.js";
export type { CreateInput } from "./sandbox-creation.js";

/** What create/connect hand back to the api. */
export interface SandboxView {
  readonly sandboxId: string;
  readonly templateId: string;
  readonly alias: string;
  readonly envdVersion: string;
  readonly envdAccessToken: string;
  readonly trafficAccessToken: string;
  readonly domain: string;
}

/**
 * The sandbox state machine. Every change happens in a PostgreSQL transaction that holds the sandbox's row
 * lock and ends by appending to the ledger; long node calls run between two such transactions behind an
 * intermediate state (starting, pausing, resuming) so a second transition sees the first and is refused.
 *
 * This class is the one entry point the service, evictor, reconciler and drainer call; each kind of change
 * lives in its own module (creation, pause and resume, auto-resume, termination, settings), all built on
 * `sandbox-transition.ts`.
 */
export class SandboxLifecycle {
  private readonly creation: SandboxCreation;
  private readonly pausing: PauseAndResume;
  private readonly autoResume: AutoResume;
  private readonly termination: SandboxTermination;
  private readonly settings: SandboxSettings;

  constructor(private readonly deps: LifecycleDeps) {
    // Shared by creates and moves, so a burst of either spreads over the nodes instead of piling onto one.
    const recentPlacements = new RecentPlacements();
    this.creation = new SandboxCreation(deps, recentPlacements);
    this.pausing = new PauseAndResume(deps, recentPlacements);
    this.autoResume = new AutoResume(deps, this.pausing);
    this.termination = new SandboxTermination(deps);
    this.settings = new SandboxSettings(deps);
  }

  view(row: SandboxRow): SandboxView {
    const { tokens, config } = this.deps;
    return {
      sandboxId: row.id,
      templateId: row.sourceTemplateId ?? row.templateId,
      alias: row.alias ?? "",
      envdVersion: row.envdVersion,
      envdAccessToken: tokens.envdToken(row.id, row.tokenNonce),
      trafficAccessToken: row.trafficTokenHash ? tokens.trafficToken(row.id, row.tokenNonce) : "",
      domain: config.domain,
    };
  }

  async create(input: CreateInput): Promise<{ sandbox: SandboxView; replayed: boolean }> {
    const { row, replayed } = await this.creation.create(input);
    return { sandbox: this.view(row), replayed };
  }

  kill(sandboxId: string, teamId: string | undefined, reason = "killed"): Promise<void> {
    return this.termination.kill(sandboxId, teamId, reason);
  }

  markLost(sandboxId: string, reason: string, data: Record<string, unknown>): Promise<boolean> {
    return this.termination.markLost(sandboxId, reason, data);
  }

  logs(sandboxId: string, teamId: string, limit: number): Promise<SandboxLogLine[]> {
    return this.settings.logs(sandboxId, teamId, limit);
  }

  updateNetwork(
    sandboxId: string,
    teamId: string,
    network: Record<string, unknown>,
    allowInternetAccess: boolean | null,
  ): Promise<void> {
    return this.settings.updateNetwork(sandboxId, teamId, network, allowInternetAccess);
  }

  setTimeout(sandboxId: string, teamId: string, seconds: number, extendOnly: boolean): Promise<{ endAt: Date }> {
    return this.settings.setTimeout(sandboxId, teamId, seconds, extendOnly);
  }

  async connect(
    sandboxId: string,
    teamId: string,
    seconds: number,
    memory: boolean | undefined,
  ): Promise<{ sandbox: SandboxView; resumed: boolean }> {
    const timeout = seconds > 0 ? seconds : DEFAULT_TIMEOUT_SECONDS;
    const row = await transition(this.deps.db, sandboxId, teamId, async (_tx, current) => current);
    if (row.state === "running" || row.state === "pausing") {
      if (row.state === "running") await this.setTimeout(sandboxId, teamId, timeout, true);
      return { sandbox: this.view(row), resumed: false };
    }
    if (row.state === "paused") {
      const resumed = await this.pausing.resume(sandboxId, teamId, timeout, memory ?? true);
      return { sandbox: this.view(resumed), resumed: true };
    }
    if (row.state === "starting") throw notFound(sandboxId);
    throw new MasterError("busy", `sandbox ${sandboxId} is ${row.state}; retry shortly`);
  }

  pause(sandboxId: string, teamId: string | undefined, memory: boolean): Promise<void> {
    return this.pausing.pause(sandboxId, teamId, memory);
  }

  resumeOnTraffic(request: {
    sandboxId: string;
    port: number;
    trafficAccessToken: string;
    envdAccessToken: string;
  }): Promise<{ resumed: boolean }> {
    return this.autoResume.resumeOnTraffic(request);
  }
}
