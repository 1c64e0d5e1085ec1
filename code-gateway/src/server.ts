import { randomUUID } from "node:crypto";
import { rm } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { AccessCheck, headerToken } from "./access.js";
import type { GatewayConfig } from "./config.js";
import { ContextRegistry } from "./contexts.js";
import { EnvdEnvironment } from "./envs.js";
import { badRequest, GatewayError, toGatewayError } from "./errors.js";
import { type ExecuteRequest, type ExecutionSink, runExecution } from "./execution.js";
import { isValidEnvName, type Language, normalizeLanguage, unsupportedLanguageMessage } from "./kernels/languages.js";
import type { Logger } from "./log.js";
import type { OutputLine } from "./results.js";
import { prepareRuntimeDir } from "./runtime-dir.js";

const MAX_BODY_BYTES = 16 * 1024 * 1024;
/** envd's 401 body, so the SDK maps it the same way. */

export interface Gateway {
  readonly url: string;
  readonly port: number;
  readonly contexts: ContextRegistry;
  close(): Promise<void>;
}

/** Starts the HTTP server and the default contexts; resolves once it listens and they run. */
export async function startGateway(config: GatewayConfig, log: Logger): Promise<Gateway> {
  await prepareRuntimeDir(config.runtimeDir, log);
  const contexts = new ContextRegistry(config, kernelEnvironment(process.env), log);
  const envd = new EnvdEnvironment(config.envdUrl, config.envdTimeoutMs, log);
  const deps = { config, envd, log };
  const access = new AccessCheck({
    fixedToken: config.accessToken,
    envd: config.authFromEnvd ? envd : undefined,
    envdTimeoutMs: config.envdTimeoutMs,
    log,
  });

  /** The default contexts' start: see GET /warren/ready. */
  let defaults: "starting" | "started" | "failed" = "starting";

  const handle = async (req: IncomingMessage, res: ServerResponse, requestId: string) => {
    const url = new URL(req.url ?? "/", "http://gateway");
    const path = url.pathname.replace(/\/+$/, "") || "/";
    const method = req.method ?? "GET";
    if (path === "/health" && method === "GET") return sendJson(res, 200, "OK");
    // Warren's own: 200 once the default kernels' start has ended (`started`, or `failed`: waiting longer would
    // not help), 503 while they start. The microVM driver snapshots a code template only then, so a sandbox's
    // first execution finds its kernel running. Nothing secret in it: no token.
    if (path === "/warren/ready" && method === "GET") {
      return sendJson(res, defaults === "starting" ? 503 : 200, { kernels: defaults });
    }
    if (path === "/execute" && method === "POST") {
      await access.check(req);
      const request = parseExecuteRequest(await readJson(req));
      const context = request.contextId
        ? contexts.get(request.contextId)
        : await contexts.defaultFor(requestLanguage(request.language));
      return streamExecution(req, res, requestId, config.keepaliveMs, async (sink) => {
        await runExecution(context, request, sink, config.accessToken ?? headerToken(req), deps);
      });
    }
    if (path === "/contexts" && method === "POST") {
      const body = await readJson(req);
      const fields = isObject(body) ? body : {};
      const language = requestLanguage(optionalString(fields.language, "language"));
      const context = await contexts.create(language, optionalString(fields.cwd, "cwd"));
      return sendJson(res, 200, context.toJSON());
    }
    if (path === "/contexts" && method === "GET") return sendJson(res, 200, contexts.list());
    const match = /^\/contexts\/([^/]+)(\/restart)?$/.exec(path);
    if (match?.[1]) {
      const id = decodeURIComponent(match[1]);
      if (!match[2] && method === "DELETE") {
        await contexts.remove(id);
        return sendJson(res, 200, null);
      }
      if (match[2] && method === "POST") {
        await contexts.restart(id);
        return sendJson(res, 200, null);
      }
    }
    throw new GatewayError(404, `no route for ${method} ${path}`);
  };

  const server: Server = createServer((req, res) => {
    const requestId = randomUUID();
    const started = performance.now();
    res.once("close", () => {
      log.info("request", {
        requestId,
        sandboxId: req.headers["e2b-sandbox-id"],
        method: req.method,
        path: req.url?.split("?")[0],
        status: res.statusCode,
        ms: Math.round(performance.now() - started),
      });
    });
    handle(req, res, requestId).catch((error: unknown) => {
      const failure = toGatewayError(error);
      if (failure.status >= 500) log.error("request failed", { requestId, error: failure.message });
      if (res.headersSent) {
        res.end();
        return;
      }
      if (failure.status === 401) return sendJson(res, 401, { code: 401, message: failure.message });
      res.writeHead(failure.status, { "Content-Type": "text/plain; charset=utf-8" });
      res.end(failure.message);
    });
  });
  server.keepAliveTimeout = 65_000;

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(config.port, config.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const started = Date.now();
  const outcomes = await Promise.allSettled(
    ["python", ...config.startLanguages].map((l) => {
      const language = normalizeLanguage(l);
      if (!language) throw new Error(`unsupported start language '${l}'`);
      return contexts.defaultFor(language);
    }),
  );
  for (const outcome of outcomes) {
    if (outcome.status === "rejected") log.error("default context failed to start", { error: String(outcome.reason) });
  }
  defaults = outcomes.every((outcome) => outcome.status === "fulfilled") ? "started" : "failed";
  log.info("code gateway listening", { host: config.host, port, kernelsReadyMs: Date.now() - started });
  void envd.warmUp();

  let closing: Promise<void> | undefined;
  return {
    url: `http://${config.host === "0.0.0.0" ? "127.0.0.1" : config.host}:${port}`,
    port,
    contexts,
    close() {
      closing ??= (async () => {
        server.close();
        server.closeAllConnections();
        envd.close();
        await contexts.close();
        await rm(config.runtimeDir, { recursive: true, force: true });
      })();
      return closing;
    },
  };
}

type SinkBody = (sink: ExecutionSink) => Promise<void>;

/** Writes NDJSON lines as they come, keepalives in silences, and end_of_execution last. */
async function streamExecution(
  req: IncomingMessage,
  res: ServerResponse,
  requestId: string,
  keepaliveMs: number,
  body: SinkBody,
): Promise<void> {
  const controller = new AbortController();
  res.once("close", () => {
    if (!res.writableFinished) controller.abort();
  });
  req.once("aborted", () => controller.abort());
  // A write racing a disconnect must not become an unhandled stream error.
  res.on("error", () => controller.abort());
  // The client may have left while its default context was still starting.
  if (res.destroyed || req.socket.destroyed) controller.abort();
  res.writeHead(200, {
    "Content-Type": "application/x-ndjson",
    "Cache-Control": "no-store",
    "X-Request-Id": requestId,
  });
  res.flushHeaders();
  let keepalive: NodeJS.Timeout | undefined;
  const write = (line: OutputLine) => {
    if (controller.signal.aborted) return;
    res.write(`${JSON.stringify(line)}\n`);
    if (keepalive) keepalive.refresh();
  };
  keepalive = setInterval(() => write({ type: "keepalive" }), keepaliveMs);
  try {
    await body({ write, aborted: controller.signal, requestId });
    write({ type: "end_of_execution" });
  } finally {
    clearInterval(keepalive);
    res.end();
  }
}

function requestLanguage(language: string | undefined): Language {
  const normalized = normalizeLanguage(language);
  if (!normalized) {
    throw badRequest(unsupportedLanguageMessage(language ?? ""));
  }
  return normalized;
}

function parseExecuteRequest(body: unknown): ExecuteRequest {
  if (!isObject(body)) throw badRequest("request body must be a JSON object");
  if (typeof body.code !== "string") throw badRequest("'code' must be a string");
  const contextId = optionalString(body.context_id, "context_id");
  const language = optionalString(body.language, "language");
  if (contextId && language) throw badRequest("Only one of context_id or language can be provided, not both");
  const envVars: Record<string, string> = {};
  if (body.env_vars !== undefined && body.env_vars !== null) {
    if (!isObject(body.env_vars)) throw badRequest("'env_vars' must be an object of strings");
    for (const [name, value] of Object.entries(body.env_vars)) {
      if (!isValidEnvName(name)) throw badRequest(`env var name '${name}' is not a valid identifier`);
      if (typeof value !== "string") throw badRequest(`env var '${name}' must be a string`);
      envVars[name] = value;
    }
  }
  return { code: body.code, contextId, language, envVars };
}

function optionalString(value: unknown, name: string): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string") throw badRequest(`'${name}' must be a string`);
  return value;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new GatewayError(413, `request body exceeds ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  if (text.trim() === "") return {};
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw badRequest(`malformed JSON body: ${(error as Error).message}`);
  }
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text) });
  res.end(text);
}

/** Kernels inherit the gateway's environment minus its own settings and any token. */
function kernelEnvironment(env: NodeJS.ProcessEnv): Record<string, string> {
  const result: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined || name.startsWith("CODE_GATEWAY_") || /TOKEN|SECRET/i.test(name)) continue;
    result[name] = value;
  }
  result.PYDEVD_DISABLE_FILE_VALIDATION = "1";
  // What envd gives every process it starts (its own env vars, envd/src/config.ts), so a kernel's first execution
  // has nothing to set in a sandbox created without env vars of its own.
  result.E2B_SANDBOX = "true";
  return result;
}
