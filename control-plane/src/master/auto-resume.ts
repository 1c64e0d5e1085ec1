import { timingSafeEqual } from "node:crypto";
// envd's port: requests to it carry the envd access token (X-Access-Token).
import { ENVD_PORT } from "@warren/proto/ports";
import { getSandbox, type SandboxRow } from "../store/sandboxes.js";
import { MasterError, notFound } from "./errors.js";
import { DEFAULT_TIMEOUT_SECONDS, type LifecycleDeps } from "./lifecycle-deps.js";
import type { PauseAndResume } from "./pause-resume.js";
import { sha256Hex } from "./tokens.js";

function sameToken(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** Resumes a paused sandbox when traffic reaches it: the caller's tokens checked, concurrent callers coalesced. */
export class AutoResume {
  constructor(
    private readonly deps: LifecycleDeps,
    private readonly pausing: PauseAndResume,
  ) {}

  private readonly trafficResumes = new Map<string, Promise<{ resumed: boolean }>>();

  /**
   * Auto-resume on traffic (the proxy, through the api): E2B's rules (`proxy_grpc.go`). Only a sandbox created
   * with autoResume whose last pause kept memory; the request's tokens must match (envd port: the envd access
   * token; other ports of a private sandbox: the traffic token); a transition in progress is waited for. Many
   * concurrent callers share one resume (per master process; across replicas the row lock and the `paused`
   * check make every other caller wait for, not repeat, the resume).
   */
  async resumeOnTraffic(request: {
    sandboxId: string;
    port: number;
    trafficAccessToken: string;
    envdAccessToken: string;
  }): Promise<{ resumed: boolean }> {
    const { db, tokens } = this.deps;
    const { sandboxId } = request;
    const row = await getSandbox(db, sandboxId);
    if (!row || !row.autoResume || row.state === "killed" || row.state === "failed" || row.state === "starting") {
      throw notFound(sandboxId);
    }
    if (request.port === ENVD_PORT) {
      if (!sameToken(request.envdAccessToken, tokens.envdToken(row.id, row.tokenNonce))) {
        throw new MasterError("forbidden", `invalid X-Access-Token for sandbox ${sandboxId}`);
      }
    } else if (row.trafficTokenHash !== null && sha256Hex(request.trafficAccessToken) !== row.trafficTokenHash) {
      throw new MasterError("forbidden", `invalid traffic access token for sandbox ${sandboxId}`);
    }
    let shared = this.trafficResumes.get(sandboxId);
    if (!shared) {
      shared = this.resumeWhenSettled(row).finally(() => this.trafficResumes.delete(sandboxId));
      this.trafficResumes.set(sandboxId, shared);
    }
    return shared;
  }

  private async resumeWhenSettled(first: SandboxRow): Promise<{ resumed: boolean }> {
    const deadline = Date.now() + this.deps.config.replayWaitMs;
    let row: SandboxRow | undefined = first;
    for (;;) {
      if (!row || row.state === "killed" || row.state === "failed") throw notFound(first.id);
      if (row.state === "running") return { resumed: false };
      if (row.state === "paused") {
        if (!(await this.pausing.pausedWithMemory(row.id))) throw notFound(row.id);
        try {
          await this.pausing.resume(row.id, row.teamId, DEFAULT_TIMEOUT_SECONDS, true);
          return { resumed: true };
        } catch (error) {
          // Another resume (an explicit connect) took the row first: wait for it like for any transition.
          if (!(error instanceof MasterError && error.kind === "busy")) throw error;
        }
      }
      if (Date.now() > deadline) throw new MasterError("busy", `sandbox ${first.id} is still ${row.state}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
      row = await getSandbox(this.deps.db, first.id);
    }
  }
}
