import type { Redis } from "ioredis";
import type { Db } from "../store/db.js";
import type { Logger } from "./log.js";
import type { NodeAgentConnector } from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";
import type { TokenIssuer } from "./tokens.js";

export interface LifecycleConfig {
  /** Base domain handed to clients; empty means "use your own". */
  readonly domain: string;
  readonly placementAttempts: number;
  readonly memoryOvercommit: number;
  /** How long a replayed create waits for the original to finish. */
  readonly replayWaitMs: number;
  /**
   * How long a create waits for a node that is still building the template (its first start) or still starting,
   * before answering 503 (WARREN_CREATE_TEMPLATE_WAIT_MS, default 50 s: inside the SDK's 60 s request timeout).
   */
  readonly templateWaitMs: number;
}

/** What every part of the sandbox lifecycle (see `lifecycle.ts`) is built from. */
export interface LifecycleDeps {
  readonly db: Db;
  readonly redis: Redis;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly tokens: TokenIssuer;
  readonly log: Logger;
  readonly config: LifecycleConfig;
}

/** E2B's default lifetime, for requests that carry none (`@warren/proto/sandbox-lifetime`). */
export { DEFAULT_SANDBOX_TIMEOUT_SECONDS as DEFAULT_TIMEOUT_SECONDS } from "@warren/proto/sandbox-lifetime";
