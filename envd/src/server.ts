import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { ENVD_ENVS_PATH } from "@warren/proto/envd-http";
import { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { Process } from "@warren/proto/process/process_pb";
import { secretsEqual } from "./auth.js";
import type { EnvdConfig } from "./config.js";
import type { EnvdContext } from "./context.js";
import { loadFsXattr } from "./filesystem/metadata.js";
import { createFilesystemService } from "./filesystem/service.js";
import { handleFiles } from "./http/files.js";
import { handleFilesCompose } from "./http/files-compose.js";
import { handleInit } from "./http/init.js";
import { handleLeases, LEASES_PATH } from "./http/leases.js";
import { MetricsSampler } from "./http/metrics.js";
import { sendError, sendJson, sendJsonError } from "./http/respond.js";
import { createLogger, type Logger } from "./log.js";
import { LoopbackForwarder } from "./ports/loopback-forwarder.js";
import { createProcessService } from "./process/service.js";
import { relabelUnaryDecodeErrors, streamDecodeErrors } from "./rpc-decode-errors.js";
import { SandboxState } from "./state.js";
import { UserDirectory } from "./users.js";
import { AHEAD_OF_DEMAND_ROUNDS, warmUp } from "./warmup.js";

export interface RunningEnvd {
  readonly url: string;
  readonly port: number;
  readonly context: EnvdContext;
  /** Stops accepting, ends open streams, kills the processes envd started, removes watchers. */
  close(): Promise<void>;
}

const CORS_HEADERS = {
  "Access-Control-Allow-Origin": "*",
  "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
  "Access-Control-Allow-Headers": "*",
  "Access-Control-Expose-Headers":
    "Connect-Protocol-Version, Connect-Timeout-Ms, Grpc-Status, Grpc-Message, X-Envd-Version, Warren-Output-Offset",
  "Access-Control-Max-Age": "7200",
};

const UNAUTHORIZED = "unauthorized access, please provide a valid access token or method signing if supported";

export async function startEnvd(config: EnvdConfig, log: Logger = createLogger("envd")): Promise<RunningEnvd> {
  const context: EnvdContext = { config, state: new SandboxState(config), users: new UserDirectory(), log };
  const processes = createProcessService(context);
  const filesystem = createFilesystemService(context);
  const metrics = new MetricsSampler();

  const rpc = connectNodeAdapter({
    grpc: false,
    grpcWeb: false,
    interceptors: [streamDecodeErrors],
    routes(router) {
      router.service(Process, processes.impl);
      router.service(Filesystem, filesystem.impl);
      relabelUnaryDecodeErrors(router);
    },
    fallback(_req, res) {
      res.writeHead(404, { "Content-Type": "application/json; charset=utf-8" });
      res.end(JSON.stringify({ code: 404, message: "not found" }));
    },
  });

  let warmed: Promise<void> | undefined;
  let listeningPort = 0;
  const warmUpOnce = () => {
    const laterRounds = config.warmup === "now" ? AHEAD_OF_DEMAND_ROUNDS : 0;
    warmed ??= warmUp(listeningPort, context.state.accessToken, log, laterRounds).then(() => {
      // The metadata addon too, so that a client's first file call does not load it (metadata.ts).
      try {
        loadFsXattr();
      } catch (error) {
        log.warn("could not load fs-xattr", { error: (error as Error).message });
      }
    });
  };

  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?", 1)[0];
    for (const [name, value] of Object.entries(CORS_HEADERS)) res.setHeader(name, value);
    if (req.method === "OPTIONS") {
      res.writeHead(204).end();
      return;
    }
    if (path === "/health" && req.method === "GET") {
      res.writeHead(204, { "Cache-Control": "no-store" }).end();
      return;
    }
    if (path === "/init" && req.method === "POST") {
      await handleInit(req, res, context);
      // A cold start's /init is answered: the create goes on to its caller while envd warms up.
      if (config.warmup === "after-init") warmUpOnce();
      return;
    }
    // /files checks the token or a URL signature itself.
    if (path === "/files") return handleFiles(req, res, context);
    const token = context.state.accessToken;
    if (token !== undefined) {
      const given = req.headers["x-access-token"];
      if (typeof given !== "string" || !secretsEqual(given, token)) {
        sendJsonError(res, 401, UNAUTHORIZED);
        return;
      }
    }
    if (path === ENVD_ENVS_PATH && req.method === "GET") return sendJson(res, 200, context.state.envVars());
    if (path === "/metrics" && req.method === "GET") return sendJson(res, 200, await metrics.sample());
    if (path === "/files/compose" && req.method === "POST") return handleFilesCompose(req, res, context);
    if (path === LEASES_PATH || path?.startsWith(`${LEASES_PATH}/`)) {
      return handleLeases(req, res, path, processes.leases);
    }
    rpc(req, res);
  };

  // maxHeaderSize: a Start's secrets arrive in one header (the proxy's warren-secret-env, up to 32 × 32 KiB values).
  const server: Server = createServer(
    { keepAliveTimeout: 65_000, requestTimeout: 0, maxHeaderSize: 2 << 20 },
    (req, res) => {
      route(req, res).catch((error: unknown) => sendError(res, error));
    },
  );
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(config.port, config.host, () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  listeningPort = port;
  const host = config.host.includes(":") ? `[${config.host}]` : config.host;
  log.info("envd listening", { host: config.host, port });
  if (config.warmup === "now") warmUpOnce();
  const forwarder = config.exposeLoopback ? new LoopbackForwarder({ log }) : undefined;
  forwarder?.start();

  let closing: Promise<void> | undefined;
  return {
    url: `http://${host === "0.0.0.0" ? "127.0.0.1" : host}:${port}`,
    port,
    context,
    close() {
      closing ??= (async () => {
        await warmed;
        const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
        await Promise.all([processes.close(), filesystem.close(), forwarder?.close()]);
        server.closeAllConnections();
        await stopped;
        log.info("envd stopped");
      })();
      return closing;
    },
  };
}
