import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A stand-in for the template endpoints of E2B's API (E2B-TEMPLATES.md §1.2, §2), recording every request
 * with its raw body, so a test can drive Warren's SDK and the `e2b` SDK through the same build and compare
 * what each sent.
 */

export interface RecordedCall {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

export interface LogLine {
  timestamp: string;
  level: string;
  message: string;
  step?: string;
}

export interface FakeTemplateApi {
  readonly url: string;
  readonly calls: RecordedCall[];
  /** Uploaded archives by files hash. */
  readonly uploads: Map<string, Buffer>;
  /** Hashes the server already has (`present: true`). */
  readonly present: Set<string>;
  /** The build's log and how it ends. */
  log: LogLine[];
  final: { status: "ready" | "error"; reason?: { message: string; step?: string } };
  /** Entries per status page (E2B: 100). */
  pageSize: number;
  /** Answers a call before the fake does (return true when handled). */
  override: ((call: RecordedCall, res: ServerResponse) => boolean) | undefined;
  reset(): void;
  close(): Promise<void>;
}

export const TEMPLATE_ID = "k1q7t3v0m2x9c8b4n6z5";
export const BUILD_ID = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f";

function send(res: ServerResponse, status: number, body?: unknown): void {
  if (body === undefined) {
    res.writeHead(status, { "Content-Length": "0" }).end();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text) }).end(text);
}

export const DEFAULT_LOG: LogLine[] = [
  { timestamp: "2026-01-01T10:00:00.123Z", level: "info", message: "[base] FROM ubuntu:22.04 [9c0e]", step: "base" },
  {
    timestamp: "2026-01-01T10:00:01.000Z",
    level: "debug",
    message: "\u001b[32m[builder 1/2] COPY\u001b[0m",
    step: "1",
  },
  { timestamp: "2026-01-01T10:00:02.000Z", level: "info", message: "[builder 2/2] RUN echo hi", step: "2" },
  { timestamp: "2026-01-01T10:00:03.000Z", level: "warn", message: "Build finished, took 3s", step: "finalize" },
];

export async function startFakeTemplateApi(): Promise<FakeTemplateApi> {
  let server: Server;
  const api: FakeTemplateApi = {
    url: "",
    calls: [],
    uploads: new Map(),
    present: new Set(),
    log: [...DEFAULT_LOG],
    final: { status: "ready" },
    pageSize: 2,
    override: undefined,
    reset() {
      api.calls.length = 0;
      api.uploads.clear();
      api.present.clear();
      api.log = [...DEFAULT_LOG];
      api.final = { status: "ready" };
      api.pageSize = 2;
      api.override = undefined;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };

  const handle = (call: RecordedCall, res: ServerResponse) => {
    if (api.override?.(call, res)) return;
    const url = new URL(call.url, "http://x");
    const path = url.pathname;
    const files = /^\/templates\/([^/]+)\/files\/([0-9a-f]{64})$/.exec(path);
    const upload = /^\/upload\/([0-9a-f]{64})$/.exec(path);
    if (call.method === "POST" && path === "/v3/templates") {
      const body = JSON.parse(call.body.toString()) as { name: string; tags?: string[] };
      const tag = body.name.includes(":") ? [body.name.split(":")[1] as string] : [];
      const tags = [...tag, ...(body.tags ?? [])];
      return send(res, 202, {
        templateID: TEMPLATE_ID,
        buildID: BUILD_ID,
        names: [`acme/${body.name.split(":")[0]}`],
        aliases: [body.name.split(":")[0]],
        tags: tags.length > 0 ? tags : ["default"],
        public: false,
      });
    }
    if (call.method === "GET" && files) {
      const hash = files[2] as string;
      return send(res, 201, {
        present: api.present.has(hash),
        url: `${api.url}/upload/${hash}?sig=abc`,
        headers: { "X-Upload-Token": "upload-token", "Content-Length": "1" },
      });
    }
    if (call.method === "PUT" && upload) {
      api.uploads.set(upload[1] as string, call.body);
      return send(res, 200);
    }
    if (call.method === "POST" && /^\/v2\/templates\/[^/]+\/builds\/[^/]+$/.test(path)) return send(res, 202);
    if (call.method === "GET" && /^\/templates\/[^/]+\/builds\/[^/]+\/status$/.test(path)) {
      const offset = Number(url.searchParams.get("logsOffset") ?? "0");
      const page = api.log.slice(offset, offset + api.pageSize);
      const done = offset + page.length >= api.log.length;
      return send(res, 200, {
        buildID: BUILD_ID,
        templateID: TEMPLATE_ID,
        status: done ? api.final.status : "building",
        logs: [],
        logEntries: page,
        ...(done && api.final.reason ? { reason: api.final.reason } : {}),
      });
    }
    send(res, 404, { code: 404, message: `no route ${call.method} ${path}` });
  };

  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const call = { method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks) };
      api.calls.push(call);
      handle(call, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  (api as { url: string }).url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return api;
}

export { send };
