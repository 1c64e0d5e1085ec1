import { ResumeError, type ResumeRequest, type SandboxResumer } from "./resume.js";

/** Header carrying the shared internal token (the api's WARREN_INTERNAL_TOKEN). */
const INTERNAL_TOKEN_HEADER = "X-Warren-Internal-Token";

export interface ControlPlaneResumerOptions {
  /** The api's base URL (PROXY_RESUME_URL). */
  readonly url: string;
  /** The api's WARREN_INTERNAL_TOKEN. */
  readonly token: string;
}

/**
 * The real SandboxResumer: `POST <api>/warren/v1/internal/sandboxes/{id}/resume` with the requested port and the
 * client's token headers. The api asks the master, which checks the sandbox's auto-resume policy and the tokens,
 * waits out a transition in progress, and resumes (one resume however many requests and proxies ask). It answers
 * once the sandbox runs again; the new route is already in Redis, so AutoResume's wait ends at once.
 */
export class ControlPlaneResumer implements SandboxResumer {
  private readonly base: string;

  constructor(private readonly options: ControlPlaneResumerOptions) {
    this.base = options.url.replace(/\/+$/, "");
  }

  async resume(request: ResumeRequest): Promise<void> {
    const response = await fetch(
      `${this.base}/warren/v1/internal/sandboxes/${encodeURIComponent(request.sandboxId)}/resume`,
      {
        method: "POST",
        headers: { "Content-Type": "application/json", [INTERNAL_TOKEN_HEADER]: this.options.token },
        body: JSON.stringify({
          port: request.port,
          trafficAccessToken: request.trafficAccessToken ?? "",
          envdAccessToken: request.envdAccessToken ?? "",
        }),
        signal: request.signal,
      },
    );
    const text = await response.text().catch(() => "");
    if (response.ok) return;
    let message = text;
    try {
      message = (JSON.parse(text) as { message?: string }).message ?? text;
    } catch {
      // keep the raw body
    }
    switch (response.status) {
      case 404:
        throw new ResumeError("not-found", message);
      case 403:
        throw new ResumeError("forbidden", message);
      case 409:
        throw new ResumeError("transitioning", message);
      case 429:
        throw new ResumeError("limit", message);
      default:
        throw new Error(`resume call answered ${response.status}: ${message}`);
    }
  }
}
