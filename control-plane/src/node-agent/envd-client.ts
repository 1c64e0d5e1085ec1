import { request } from "node:http";

export interface EnvdInit {
  readonly envVars: Readonly<Record<string, string>>;
  readonly accessToken: string;
  readonly defaultUser: string;
  readonly defaultWorkdir: string;
  /** The token envd already holds (a sandbox started from a memory snapshot keeps its source's): sent to /init. */
  readonly currentAccessToken?: string;
}

/**
 * POST /init to a fresh sandbox's envd: env vars, access token, default user and workdir, and the node's clock
 * (envd accepts the timestamp; a namespace sandbox shares the host clock anyway). Resolves with envd's version.
 */
export function initEnvd(envdUrl: string, init: EnvdInit, timeoutMs = 5000): Promise<string> {
  const { currentAccessToken, ...fields } = init;
  const body = JSON.stringify({ ...fields, timestamp: new Date().toISOString() });
  const url = new URL("/init", envdUrl);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        method: "POST",
        agent: false,
        timeout: timeoutMs,
        headers: {
          "Content-Type": "application/json",
          "Content-Length": Buffer.byteLength(body),
          ...(currentAccessToken ? { "X-Access-Token": currentAccessToken } : {}),
        },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8").on("data", (chunk: string) => {
          text += chunk;
        });
        res.on("end", () => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) resolve(String(res.headers["x-envd-version"] ?? ""));
          else reject(new Error(`envd /init answered ${status}: ${text.slice(0, 200)}`));
        });
      },
    );
    req.once("timeout", () => req.destroy(new Error(`envd /init timed out after ${timeoutMs} ms`)));
    req.once("error", reject);
    req.end(body);
  });
}
