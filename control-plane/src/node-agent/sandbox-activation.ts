import { randomBytes } from "node:crypto";
import type { Instance, RuntimeDriver } from "../runtime/driver.js";
import { CLOSED_EGRESS, compileEgress, type EgressPolicy, EgressPolicyError } from "../runtime/egress/policy.js";
import { initEnvd } from "./envd-client.js";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";
import type { RoutePublisher } from "./routes.js";
import {
  type CreateSandboxInput,
  type SandboxPlacement,
  type SandboxSummary,
  type sandboxRoute,
  summaryOf,
} from "./sandbox-model.js";

export interface ActivationDeps {
  readonly driver: RuntimeDriver;
  readonly routes: RoutePublisher;
  /** The agent's sandboxes by id (the new one is added here once its route is written). */
  readonly sandboxes: Map<string, SandboxSummary>;
  readonly routeOf: (summary: SandboxSummary) => ReturnType<typeof sandboxRoute>;
  readonly nextGeneration: () => number;
}

export interface Activation {
  readonly started: Instance;
  readonly input: Omit<CreateSandboxInput, "templateId">;
  readonly egress: EgressPolicy;
  /** Whether the instance came from a warm pool. */
  readonly pooled: boolean;
  /** The pool was empty: the create waited for one of the pool's starts (WarmPool.next); logged. */
  readonly waitedForPool?: boolean;
  readonly log: Logger;
  /** The token envd already holds (a sandbox started from a memory snapshot keeps its source's). */
  readonly currentAccessToken?: string;
}

/**
 * Makes a started instance the sandbox: envd /init (token, env vars), egress policy, labels, route. On failure
 * the instance is removed and the route deleted.
 */
export async function activateSandbox(deps: ActivationDeps, activation: Activation): Promise<SandboxPlacement> {
  const { started, input, egress, pooled, log, currentAccessToken } = activation;
  let instance = started;
  const exec = randomBytes(8).toString("hex");
  const generation = deps.nextGeneration();
  let routeWritten = false;
  try {
    const claimed = instance;
    // A pooled sandbox started in the background CPU class (a refill yields to creates and commands); from now on
    // a user waits for it.
    if (pooled) await deps.driver.foreground?.(claimed.instanceId);
    const labels = {
      pooled: "",
      sandboxId: input.sandboxId,
      exec,
      generation: String(generation),
      teamId: input.teamId,
      publicTraffic: input.publicTraffic ? "1" : "0",
      trafficTokenHash: input.trafficTokenHash ?? "",
      autoResume: input.autoResume ? "1" : "0",
      maskRequestHost: input.maskRequestHost ?? "",
      defaultUser: input.defaultUser || "user",
      metadata: JSON.stringify(input.metadata ?? {}),
    };
    // The labels go to disk while envd is set up: the route below is written only once both are done.
    const [envdVersion, , labeled] = await Promise.all([
      initEnvd(
        claimed.envdUrl,
        {
          envVars: input.envVars ?? {},
          accessToken: input.envdAccessToken ?? "",
          defaultUser: input.defaultUser || "user",
          defaultWorkdir: input.defaultWorkdir || "/home/user",
          ...(currentAccessToken ? { currentAccessToken } : {}),
        },
        deps.driver.envdInitTimeoutMs,
      ),
      deps.driver.setEgress?.(claimed.instanceId, egress),
      deps.driver.label(claimed.instanceId, labels),
    ]);
    instance = labeled;
    const summary = summaryOf(instance);
    if (!summary) throw new Error("instance lost its labels");
    routeWritten = await deps.routes.write(deps.routeOf(summary));
    if (!routeWritten) throw new Error("Redis holds a newer route for this sandbox id");
    deps.sandboxes.set(input.sandboxId, summary);
    log.info("sandbox created", {
      exec,
      pooled,
      ...(activation.waitedForPool ? { waitedForPool: true } : {}),
      addr: instance.addr,
      instanceId: instance.instanceId,
    });
    return {
      sandboxId: input.sandboxId,
      exec,
      generation,
      sandboxAddr: instance.addr,
      envdUrl: instance.envdUrl,
      envdVersion,
      pooled,
    };
  } catch (error) {
    log.warn("create failed after start; removing the sandbox", { error });
    if (routeWritten) await deps.routes.delete(input.sandboxId, exec, generation).catch(() => undefined);
    await deps.driver.kill(instance.instanceId).catch((e) => log.error("cleanup failed", { error: e }));
    throw error instanceof AgentError
      ? error
      : new AgentError("internal", `create failed: ${(error as Error).message}`);
  }
}

/** Validates a policy and refuses ones the driver cannot enforce (it keeps egress closed). */
export function checkEgress(policy: EgressPolicy, driver: Pick<RuntimeDriver, "name" | "setEgress">): EgressPolicy {
  let compiled: ReturnType<typeof compileEgress>;
  try {
    compiled = compileEgress(policy);
  } catch (error) {
    if (error instanceof EgressPolicyError) throw new AgentError("invalid_argument", error.message);
    throw error;
  }
  if (!driver.setEgress && compiled.key !== compileEgress(CLOSED_EGRESS).key) {
    throw new AgentError(
      "failed_precondition",
      `the ${driver.name} driver cannot open sandbox egress on this node; ask for allow_internet_access: false`,
    );
  }
  return policy;
}
