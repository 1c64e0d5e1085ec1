import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { EnvdConfig } from "./config.js";
import type { EnvdContext } from "./context.js";
import { handleInit } from "./http/init.js";
import { sendError } from "./http/respond.js";
import { createLogger, type Logger } from "./log.js";
import { LoopbackForwarder } from "./ports/loopback-forwarder.js";
import type { EnvdServices } from "./services.js";
import { SandboxState } from "./state.js";
import { UserDirectory } from "./users.js";
import { AHEAD_OF_DEMAND_ROUNDS } from "./warmup.js";

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
const CORS_ENTRIES = Object.entries(CORS_HEADERS);

export async function startEnvd(config: EnvdConfig, log: Logger = createLogger("envd")): Promise<RunningEnvd> {
  const context: EnvdContext = { config, state: new SandboxState(config), users: new UserDirectory(), log };

  // envd listens with only `/health` and `/init` ready: the rest (services.ts: the protobuf descriptors, Connect,
  // the spawner, ~a third of envd's start) is evaluated after a cold start's `/init` is answered, while the create's
  // answer travels to its caller, or at once in a pool's sandbox (`--warm-up now`), or at the first request that
  // needs it. A request that arrives meanwhile waits for it.
  let services: Promise<EnvdServices> | undefined;
  const loadServices = () => {
    services ??= import("./services.js")
      .then((module) => module.createServices(context))
      .catch((error: unknown) => {
        // What failing to start did before the services were deferred: envd exits, and the node agent reports the
        // sandbox lost, rather than serving /health while every command fails.
        log.error("failed to start", { error: error instanceof Error ? error.message : String(error) });
        process.exit(1);
      });
    return services;
  };
  let warmed: Promise<void> | undefined;
  let listeningPort = 0;
  const warmUpOnce = () => {
    const laterRounds = config.warmup === "now" ? AHEAD_OF_DEMAND_ROUNDS : 0;
    warmed ??= loadServices().then((loaded) => loaded.warmUp(listeningPort, laterRounds));
  };

  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?", 1)[0] ?? "/";
    // As E2B's envd (rs/cors): CORS headers only for a browser's request, which names its origin.
    if (req.headers.origin !== undefined) {
      for (const [name, value] of CORS_ENTRIES) res.setHeader(name, value);
    }
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
      // A cold start's /init is answered: the create goes on to its caller while envd loads the rest and warms up.
      if (config.warmup === "after-init") warmUpOnce();
      return;
    }
    const loaded = await loadServices();
    return loaded.handle(req, res, path);
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
        const loaded = await services;
        await Promise.all([loaded?.close(), forwarder?.close()]);
        server.closeAllConnections();
        await stopped;
        log.info("envd stopped");
      })();
      return closing;
    },
  };
}
