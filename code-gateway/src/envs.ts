import { ENVD_ACCESS_TOKEN_HEADER, ENVD_ENVS_PATH, parseEnvdEnvVars } from "@warren/proto/envd-http";
import type { Logger } from "./log.js";

/**
 * Reads the sandbox-global environment variables from envd (`GET /envs`, token-checked),
 * the ones /init set. When envd cannot be reached the gateway carries on without them.
 */
export class EnvdEnvironment {
  constructor(
    private readonly envdUrl: string,
    private readonly timeoutMs: number,
    private readonly log: Logger,
  ) {}

  async fetch(accessToken: string | undefined): Promise<Record<string, string>> {
    const headers: Record<string, string> = {};
    if (accessToken) headers[ENVD_ACCESS_TOKEN_HEADER] = accessToken;
    try {
      const res = await fetch(`${this.envdUrl}${ENVD_ENVS_PATH}`, {
        headers,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      if (!res.ok) {
        this.log.warn("envd refused GET /envs; sandbox-global env vars not applied", {
          envdUrl: this.envdUrl,
          status: res.status,
        });
        return {};
      }
      return parseEnvdEnvVars(await res.json());
    } catch (error) {
      this.log.warn("envd is not reachable; sandbox-global env vars not applied", {
        envdUrl: this.envdUrl,
        error: error instanceof Error ? error.message : String(error),
      });
      return {};
    }
  }
}
