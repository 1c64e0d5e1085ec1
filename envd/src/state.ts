import type { EnvdConfig } from "./config.js";

/**
 * What /init can change at run time: the sandbox-wide env vars, the access token and the
 * defaults for user and workdir. One instance per envd, shared by every service.
 */
export class SandboxState {
  /** Set by envd itself (E2B_SANDBOX=true, ...); /init never removes them. */
  private readonly internalEnv: Record<string, string>;
  private userEnv: Record<string, string> = {};
  accessToken: string | undefined;
  defaultUser: string;
  defaultWorkdir: string | undefined;

  constructor(config: EnvdConfig) {
    this.internalEnv = { ...config.envVars };
    this.accessToken = config.accessToken;
    this.defaultUser = config.defaultUser;
    this.defaultWorkdir = config.defaultWorkdir;
  }

  /** Every sandbox-wide env var, user ones last so they win. */
  envVars(): Record<string, string> {
    return { ...this.internalEnv, ...this.userEnv };
  }

  /** /init replaces the user env set as a whole, as E2B's orchestrator expects. */
  replaceUserEnv(vars: Record<string, string>): void {
    this.userEnv = { ...vars };
  }

  setInternalEnv(name: string, value: string): void {
    this.internalEnv[name] = value;
  }
}
