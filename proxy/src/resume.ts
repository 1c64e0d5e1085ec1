import type { SandboxRoute } from "@warren/proto/redis";
import type { ProxyError } from "./errors.js";
import type { Logger } from "./log.js";
import type { RouteStore } from "./routes.js";

/** What the proxy passes the control plane when traffic reaches a paused sandbox. */
export interface ResumeRequest {
  readonly sandboxId: string;
  /** The incarnation the proxy saw paused: the control plane may ignore a resume it already did. */
  readonly exec: string;
  readonly port: number;
  /** Header values as the client sent them, for the control plane's own checks (never logged). */
  readonly trafficAccessToken: string | undefined;
  readonly envdAccessToken: string | undefined;
  readonly signal: AbortSignal;
}

/** Why the control plane refused or could not finish a resume. */
export type ResumeRefusal = "not-found" | "forbidden" | "transitioning" | "limit";

export class ResumeError extends Error {
  constructor(
    readonly refusal: ResumeRefusal,
    message: string,
  ) {
    super(message);
    this.name = "ResumeError";
  }
}

/**
 * The seam to the control plane: resolve once it has accepted and started the resume (the new
 * route then arrives through Redis), reject with a ResumeError when it will not resume.
 */
export interface SandboxResumer {
  resume(request: ResumeRequest): Promise<void>;
}

export type ResumeOutcome = { readonly route: SandboxRoute } | { readonly error: ProxyError };

/**
 * Holds requests for a paused sandbox whose route allows auto-resume: one resume per sandbox
 * however many requests arrive, every request waiting (at most `timeoutMs`) for the route to be
 * running again, then forwarded to the new incarnation.
 */
export class AutoResume {
  private readonly inFlight = new Map<string, Promise<ResumeOutcome>>();

  constructor(
    private readonly resumer: SandboxResumer,
    private readonly routes: RouteStore,
    private readonly timeoutMs: number,
    private readonly log: Logger,
    private readonly onOutcome: (outcome: string) => void = () => {},
  ) {}

  /** Resolves when `route`'s sandbox runs again (or with the error to answer). */
  ensureRunning(
    route: SandboxRoute,
    request: Omit<ResumeRequest, "signal" | "exec" | "sandboxId">,
  ): Promise<ResumeOutcome> {
    const shared = this.inFlight.get(route.sandboxId);
    if (shared) return shared;
    const outcome = this.run(route, request).finally(() => this.inFlight.delete(route.sandboxId));
    this.inFlight.set(route.sandboxId, outcome);
    return outcome;
  }

  get pending(): number {
    return this.inFlight.size;
  }

  private async run(
    route: SandboxRoute,
    request: Omit<ResumeRequest, "signal" | "exec" | "sandboxId">,
  ): Promise<ResumeOutcome> {
    const sandboxId = route.sandboxId;
    const signal = AbortSignal.timeout(this.timeoutMs);
    const started = Date.now();
    try {
      // A sandbox already resuming (an explicit connect, or another proxy's resume) only needs waiting for.
      if (route.state !== "resuming") {
        this.log.info("auto-resuming sandbox", { sandboxId, exec: route.exec, port: request.port });
        await this.resumer.resume({ ...request, sandboxId, exec: route.exec, signal });
      }
      const running = await this.routes.waitFor(
        sandboxId,
        (current) => current === undefined || current.state === "running",
        signal,
      );
      if (!running) {
        this.onOutcome("gone");
        return { error: { kind: "sandbox-not-found", sandboxId } };
      }
      this.onOutcome("resumed");
      this.log.info("sandbox resumed", { sandboxId, exec: running.exec, waitedMs: Date.now() - started });
      return { route: running };
    } catch (error) {
      if (error instanceof ResumeError) {
        this.onOutcome(error.refusal);
        this.log.warn("auto-resume refused", { sandboxId, refusal: error.refusal, reason: error.message });
        return { error: refusalError(sandboxId, error) };
      }
      if (signal.aborted) {
        this.onOutcome("timeout");
        this.log.warn("auto-resume did not finish in time", { sandboxId, timeoutMs: this.timeoutMs });
        return { error: { kind: "still-transitioning", sandboxId } };
      }
      this.onOutcome("failed");
      this.log.error("auto-resume failed", {
        sandboxId,
        error: error instanceof Error ? error.message : String(error),
      });
      return { error: { kind: "sandbox-not-found", sandboxId } };
    }
  }
}

function refusalError(sandboxId: string, error: ResumeError): ProxyError {
  switch (error.refusal) {
    case "not-found":
      return { kind: "sandbox-not-found", sandboxId };
    case "forbidden":
      return { kind: "resume-forbidden", sandboxId };
    case "transitioning":
      return { kind: "still-transitioning", sandboxId };
    case "limit":
      return { kind: "sandbox-limit", sandboxId, message: error.message };
  }
}
