import { createHash, timingSafeEqual } from "node:crypto";
import { Agent, request } from "node:http";
import { ENVD_ACCESS_TOKEN_HEADER, ENVD_ENVS_PATH, parseEnvdEnvVars } from "@warren/proto/envd-http";
import type { Logger } from "./log.js";

/** envd's answer to `GET /envs`: its status, and on 200 the sandbox-global env vars. */
export interface EnvdEnvsAnswer {
  readonly status: number;
  readonly envVars?: Record<string, string>;
}

/**
 * How long an answer is reused by the next caller with the same token: the access check of a sandbox's first
 * execution and that execution's env vars come from one request.
 */
const ANSWER_REUSE_MS = 2_000;

const digest = (value: string) => createHash("sha256").update(value).digest();

/**
 * The gateway's one client of envd: `GET /envs` (token-checked) gives the sandbox-global environment variables
 * /init set and, by its status, envd's verdict on a token (access.ts). Through `node:http` with a kept-alive
 * connection: the server already loads it, where the first `fetch` of a process loads undici (70–130 ms on the
 * sandbox's first `runCode`, measured in a pool's sandbox on a 2-CPU host).
 */
export class EnvdEnvironment {
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 4 });
  private kept:
    | { readonly tokenHash: Buffer; readonly at: number; readonly envVars: Record<string, string> }
    | undefined;

  constructor(
    private readonly envdUrl: string,
    private readonly timeoutMs: number,
    private readonly log: Logger,
  ) {}

  /** One `GET /envs` with `token` (rejects when envd does not answer within `timeoutMs`). */
  async ask(token: string | undefined, timeoutMs = this.timeoutMs): Promise<EnvdEnvsAnswer> {
    const { status, body } = await this.get(token, timeoutMs);
    if (status !== 200) return { status };
    const envVars = parseEnvdEnvVars(JSON.parse(body));
    this.kept = { tokenHash: digest(token ?? ""), at: Date.now(), envVars };
    return { status, envVars };
  }

  /** The sandbox-global env vars (an answer of the last moment, else envd's); none when envd cannot tell. */
  async fetch(token: string | undefined): Promise<Record<string, string>> {
    const kept = this.kept;
    if (kept && Date.now() - kept.at < ANSWER_REUSE_MS && timingSafeEqual(kept.tokenHash, digest(token ?? ""))) {
      return kept.envVars;
    }
    try {
      const answer = await this.ask(token);
      if (answer.envVars) return answer.envVars;
      this.log.warn("envd refused GET /envs; sandbox-global env vars not applied", {
        envdUrl: this.envdUrl,
        status: answer.status,
      });
    } catch (error) {
      this.log.warn("envd is not reachable; sandbox-global env vars not applied", {
        envdUrl: this.envdUrl,
        error: error instanceof Error ? error.message : String(error),
      });
    }
    return {};
  }

  /**
   * Opens the kept-alive connection to envd (and runs envd's `/envs` path once) before any execution needs it: a
   * pool's sandbox does this long before its first `runCode`, whose access check then takes ~5 ms instead of ~13.
   * Its answer is not kept (it may predate /init).
   */
  async warmUp(): Promise<void> {
    await this.get(undefined, this.timeoutMs).catch(() => undefined);
  }

  close(): void {
    this.agent.destroy();
  }

  private get(token: string | undefined, timeoutMs: number): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      const req = request(
        `${this.envdUrl}${ENVD_ENVS_PATH}`,
        { agent: this.agent, headers: token ? { [ENVD_ACCESS_TOKEN_HEADER]: token } : {}, timeout: timeoutMs },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (chunk: Buffer) => chunks.push(chunk));
          res.once("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }));
          res.once("error", reject);
        },
      );
      req.once("timeout", () => req.destroy(new Error(`envd did not answer within ${timeoutMs} ms`)));
      req.once("error", reject);
      req.end();
    });
  }
}
