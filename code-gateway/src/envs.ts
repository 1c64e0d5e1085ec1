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
    if (accessToken) headers["X-Access-Token"] = accessToken;
    try {
      const res = await fetch(`${this.envdUrl}/envs`, { headers, signal: AbortSignal.timeout(this.timeoutMs) });
      if (!res.ok) {
        this.log.warn("envd refused GET /envs; sandbox-global env vars not applied", {
          envdUrl: this.envdUrl,
          status: res.status,
        });
        return {};
      }
      const body = (await res.json()) as unknown;
      if (!body || typeof body !== "object" || Array.isArray(body)) return {};
      const vars: Record<string, string> = {};
      for (const [name, value] of Object.entries(body)) if (typeof value === "string") vars[name] = value;
      return vars;
    } catch (error) {
      this.log.warn("envd is not reachable; sandbox-global env vars not applied", {
        envdUrl: this.envdUrl,
        error: error instanceof Error ? error.message : String(error),
      });
      return {};
    }
  }
}
