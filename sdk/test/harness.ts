import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { type AddressInfo, createServer as createTcpServer, type Socket, connect as tcpConnect } from "node:net";
import { startTestEnvd, type TestEnvd, type TestEnvdOptions } from "../../envd/test/harness.js";
import { Sandbox } from "../src/index.js";

export { startTestEnvd, type TestEnvd };

export const ENVD_VERSION = "0.6.4";

/** A Warren SDK Sandbox bound to a test envd (or anything in front of it) by header routing. */
export function warrenSandbox(
  url: string,
  options: { accessToken?: string; sandboxId?: string; requestTimeoutMs?: number } = {},
): Sandbox {
  return new Sandbox({
    sandboxId: options.sandboxId ?? "warrentest",
    envdVersion: ENVD_VERSION,
    ...(options.accessToken ? { envdAccessToken: options.accessToken } : {}),
    sandboxUrl: url,
    apiKey: "test-key",
    ...(options.requestTimeoutMs !== undefined ? { requestTimeoutMs: options.requestTimeoutMs } : {}),
  });
}

export async function startEnvd(options: TestEnvdOptions = {}): Promise<TestEnvd> {
  return startTestEnvd(options);
}

/** A directory name under the test user's home, unique per test. */
export function scratch(prefix = "t"): string {
  return `warren-sdk-${prefix}-${randomBytes(4).toString("hex")}`;
}

/**
 * A TCP relay in front of a server: lets a test cut every open connection (as a network drop or a
 * restarting proxy would) or stall them (a silent half-open connection), then go on relaying.
 */
export interface Relay {
  readonly url: string;
  /** Connections accepted so far. */
  connections(): number;
  /** Destroys every open connection (both sides). */
  cut(): void;
  /** Stops forwarding on open connections without closing them. */
  stall(): void;
  /** Refuses new connections (accepts and resets them) until unblock(). */
  block(): void;
  unblock(): void;
  close(): Promise<void>;
}

export async function startRelay(targetPort: number): Promise<Relay> {
  const pairs = new Set<{ client: Socket; upstream: Socket; stalled: boolean }>();
  let accepted = 0;
  let blocked = false;
  const server = createTcpServer((client) => {
    if (blocked) {
      client.resetAndDestroy();
      return;
    }
    accepted++;
    const upstream = tcpConnect(targetPort, "127.0.0.1");
    const pair = { client, upstream, stalled: false };
    pairs.add(pair);
    client.on("data", (d) => {
      if (!pair.stalled) upstream.write(d);
    });
    upstream.on("data", (d) => {
      if (!pair.stalled) client.write(d);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      pairs.delete(pair);
    };
    client.on("close", end);
    upstream.on("close", end);
    client.on("error", end);
    upstream.on("error", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    connections: () => accepted,
    cut() {
      for (const pair of pairs) {
        pair.client.resetAndDestroy();
        pair.upstream.destroy();
      }
      pairs.clear();
    },
    stall() {
      for (const pair of pairs) pair.stalled = true;
    },
    block() {
      blocked = true;
    },
    unblock() {
      blocked = false;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const pair of pairs) {
          pair.client.destroy();
          pair.upstream.destroy();
        }
        server.close(() => resolve());
      }),
  };
}

export interface RecordedRequest {
  readonly method: string;
  readonly url: string;
  readonly headers: IncomingMessage["headers"];
  readonly body: string;
}

export type Handler = (req: RecordedRequest, res: ServerResponse) => void | Promise<void>;

/** A local HTTP server standing in for the control plane: records every request, answers with `handler`. */
export interface RecordingServer {
  readonly url: string;
  readonly requests: RecordedRequest[];
  handle(handler: Handler): void;
  close(): Promise<void>;
}

export async function startRecordingServer(): Promise<RecordingServer> {
  const requests: RecordedRequest[] = [];
  let handler: Handler = (_req, res) => {
    res.writeHead(404, { "Content-Type": "application/json" }).end('{"code":404,"message":"no handler"}');
  };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const recorded = {
        method: req.method ?? "",
        url: req.url ?? "",
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      };
      requests.push(recorded);
      void Promise.resolve(handler(recorded, res)).catch((error) => {
        res.writeHead(500).end(String(error));
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    handle(h) {
      handler = h;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "Content-Type": "application/json", ...headers }).end(JSON.stringify(body));
}

/** Polls `check` until it holds (no sleeps in assertions; a bound so a failure does not hang). */
export async function until(check: () => boolean | Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** An HTTP forwarder that records the request headers of every call before passing it on. */
export interface HeaderTap {
  readonly url: string;
  readonly seen: Array<{ path: string; headers: IncomingMessage["headers"] }>;
  close(): Promise<void>;
}

export async function startHeaderTap(targetPort: number): Promise<HeaderTap> {
  const { request } = await import("node:http");
  const seen: HeaderTap["seen"] = [];
  const server = createServer((req, res) => {
    seen.push({ path: req.url ?? "", headers: req.headers });
    const upstream = request(
      { host: "127.0.0.1", port: targetPort, method: req.method, path: req.url, headers: req.headers },
      (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      },
    );
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
