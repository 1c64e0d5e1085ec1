import type { ConnectionConfig } from "./config.js";

/**
 * sandbox.ports: reaching servers inside the sandbox. Under host routing a port is
 * `https://<port>-<id>.<domain>`; under header routing (a self-hosted proxy, no wildcard DNS)
 * it is the proxy's URL plus the `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers.
 */
export class Ports {
  /** @internal */
  constructor(
    private readonly config: ConnectionConfig,
    private readonly sandboxId: string,
    private readonly sandboxDomain: string | undefined,
    private readonly trafficAccessToken: string | undefined,
  ) {}

  /** `<port>-<id>.<domain>` (E2B's getHost). */
  host(port: number): string {
    return this.config.host(this.sandboxId, port, this.sandboxDomain);
  }

  /** Base URL that reaches `port`, whatever the routing. */
  url(port: number): string {
    return this.config.sandboxPortUrl(this.sandboxId, port, this.sandboxDomain);
  }

  /** Headers a request to `url(port)` needs (routing, and the traffic token of a private sandbox). */
  headers(port: number): Record<string, string> {
    const headers = this.config.routingHeaders(this.sandboxId, port);
    if (this.trafficAccessToken) headers["E2B-Traffic-Access-Token"] = this.trafficAccessToken;
    return headers;
  }

  /** fetch() to a path on a sandbox port, with the right URL and headers. */
  fetch(port: number, path: string, init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    for (const [name, value] of Object.entries(this.headers(port))) headers.set(name, value);
    return fetch(`${this.url(port)}${path.startsWith("/") ? path : `/${path}`}`, { ...init, headers });
  }
}
