import type { EnvdConfig } from "./config.js";
import type { Logger } from "./log.js";
import type { SandboxState } from "./state.js";
import type { UserDirectory } from "./users.js";

/** What every envd service shares: configuration, run-time state, accounts and the log. */
export interface EnvdContext {
  readonly config: EnvdConfig;
  readonly state: SandboxState;
  readonly users: UserDirectory;
  readonly log: Logger;
}

/** A service that owns resources (processes, watchers) and releases them on shutdown. */
export interface Closable {
  close(): Promise<void>;
}
