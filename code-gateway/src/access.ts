import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import type { EnvdEnvironment } from "./envs.js";
import { GatewayError, unauthorized } from "./errors.js";
import type { Logger } from "./log.js";

export const UNAUTHORIZED_MESSAGE =
  "unauthorized access, please provide a valid access token or method signing if supported";

/** How long an envd verdict on a token is reused: one envd round trip per burst, not per execution. */
const ENVD_VERDICT_TTL_MS = 2_000;

export function headerToken(req: IncomingMessage): string | undefined {
  const value = req.headers["x-access-token"];
  return Array.isArray(value) ? value[0] : value;
}

const digest = (value: string) => createHash("sha256").update(value).digest();

/**
 * Decides whether a request may execute code, with envd's rule (X-Access-Token equals the sandbox's
 * token, compared in constant time; no token configured means no check). The token is either fixed
 * at start, or, in a sandbox whose gateway starts before /init, envd's current one: envd is asked
 * (GET /envs with the caller's header answers 200 only for the right token) and the verdict is cached
 * briefly by the token's hash.
 */
export class AccessCheck {
  private verdict: { hash: Buffer; ok: boolean; at: number } | undefined;

  constructor(
    private readonly options: {
      readonly fixedToken: string | undefined;
      /** envd, asked for its verdict (CODE_GATEWAY_AUTH=envd); undefined: no check without a fixed token. */
      readonly envd: EnvdEnvironment | undefined;
      readonly envdTimeoutMs: number;
      readonly log: Logger;
    },
  ) {}

  async check(req: IncomingMessage): Promise<void> {
    const given = headerToken(req);
    if (this.options.fixedToken !== undefined) {
      if (!given || !timingSafeEqual(digest(given), digest(this.options.fixedToken))) {
        throw unauthorized(UNAUTHORIZED_MESSAGE);
      }
      return;
    }
    if (this.options.envd === undefined) return;
    const hash = digest(given ?? "");
    const cached = this.verdict;
    if (cached && Date.now() - cached.at < ENVD_VERDICT_TTL_MS && timingSafeEqual(cached.hash, hash)) {
      if (!cached.ok) throw unauthorized(UNAUTHORIZED_MESSAGE);
      return;
    }
    const ok = await this.askEnvd(this.options.envd, given);
    this.verdict = { hash, ok, at: Date.now() };
    if (!ok) throw unauthorized(UNAUTHORIZED_MESSAGE);
  }

  /**
   * One question to envd, asked again with a doubled deadline when envd does not answer in time: right after a
   * sandbox starts (or resumes) on a loaded host, envd's first answer can take longer than one timeout, and a
   * 503 on the first `runCode` would be the gateway's own doing.
   */
  private async askEnvd(envd: EnvdEnvironment, token: string | undefined): Promise<boolean> {
    let status: number | undefined;
    let lastError: unknown;
    for (let attempt = 0, timeoutMs = this.options.envdTimeoutMs; attempt < 3; attempt++, timeoutMs *= 2) {
      try {
        // A 200 carries the sandbox's env vars too, kept for the execution this check admits (envs.ts).
        status = (await envd.ask(token, timeoutMs)).status;
        break;
      } catch (error) {
        lastError = error;
      }
    }
    if (status === undefined) {
      this.options.log.warn("envd is not reachable to check an access token", {
        error: lastError instanceof Error ? lastError.message : String(lastError),
      });
      throw new GatewayError(503, "cannot verify the access token: envd is not reachable");
    }
    if (status === 200) return true;
    if (status === 401) return false;
    throw new GatewayError(503, `cannot verify the access token: envd answered ${status}`);
  }
}
