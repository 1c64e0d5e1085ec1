import type { IncomingHttpHeaders, IncomingMessage } from "node:http";
import type { SandboxRoute } from "@warren/proto/redis";
import { type Admission, admit, type Decision, header } from "./admission.js";
import type { ProxyConfig } from "./config.js";
import { TRAFFIC_TOKEN_HEADER } from "./errors.js";
import type { Logger } from "./log.js";
import type { ProxyMetrics } from "./metrics.js";
import type { AutoResume } from "./resume.js";
import type { RouteStore } from "./routes.js";
import { controlOnlyPath, type RouteTarget } from "./routing.js";

export interface RouteAdmissionDeps {
  readonly config: ProxyConfig;
  readonly routes: RouteStore;
  readonly metrics: ProxyMetrics;
  readonly log: Logger;
  /** Resumes paused sandboxes for their traffic; none: they answer as E2B's do without auto-resume. */
  readonly autoResume: AutoResume | undefined;
}

/**
 * Where each exchange's Admission comes from: everything E2B's proxy checks before forwarding, in its order —
 * control-only envd paths, the route (the cache, else Redis), the traffic token and the sandbox's state
 * (admission.ts), auto-resume of a paused sandbox. A cache hit is decided synchronously, so most exchanges pay
 * no promise.
 */
export class RouteAdmission {
  constructor(private readonly deps: RouteAdmissionDeps) {}

  /** Sandboxes whose auto-resume requests are waiting on. */
  get pendingResumes(): number {
    return this.deps.autoResume?.pending ?? 0;
  }

  /** The Admission at once on a cache hit, else a promise of it; the promise rejects only on a bug. */
  decide(req: IncomingMessage, target: RouteTarget): Admission | Promise<Admission> {
    if (target.port === this.deps.config.envdPort) {
      const path = controlOnlyPath(req.url ?? "/");
      if (path !== undefined) return { error: { kind: "control-only-path", path } };
    }
    const hit = this.deps.routes.peek(target.sandboxId);
    if (hit) {
      const decision = this.check(target, hit.route, req.headers);
      return "resume" in decision ? this.resume(req, target, decision.resume) : decision;
    }
    return this.lookup(req, target);
  }

  private async lookup(req: IncomingMessage, target: RouteTarget): Promise<Admission> {
    let route: SandboxRoute | undefined;
    try {
      route = await this.deps.routes.get(target.sandboxId);
    } catch (error) {
      this.deps.metrics.routeErrors.inc();
      this.deps.log.error("route lookup failed", {
        sandboxId: target.sandboxId,
        error: error instanceof Error ? error.message : String(error),
      });
      return { error: { kind: "sandbox-not-found", sandboxId: target.sandboxId } };
    }
    const decision = this.check(target, route, req.headers);
    return "resume" in decision ? this.resume(req, target, decision.resume) : decision;
  }

  private async resume(req: IncomingMessage, target: RouteTarget, route: SandboxRoute): Promise<Admission> {
    const outcome = await this.deps.autoResume!.ensureRunning(route, {
      port: target.port,
      trafficAccessToken: header(req.headers, TRAFFIC_TOKEN_HEADER),
      envdAccessToken: header(req.headers, "x-access-token"),
    });
    if ("error" in outcome) return outcome;
    const decision = this.check(target, outcome.route, req.headers);
    return "resume" in decision ? { error: { kind: "still-transitioning", sandboxId: target.sandboxId } } : decision;
  }

  private check(target: RouteTarget, route: SandboxRoute | undefined, headers: IncomingHttpHeaders): Decision {
    return admit(this.deps.config, target, route, headers, this.deps.autoResume !== undefined);
  }
}
