// First: Connect's modules may reach for `Headers` as they load.
import "./web-headers.js";
import type { IncomingMessage, ServerResponse } from "node:http";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { ENVD_ENVS_PATH } from "@warren/proto/envd-http";
import { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { Process } from "@warren/proto/process/process_pb";
import { secretsEqual } from "./auth.js";
import type { EnvdContext } from "./context.js";
import { loadFsXattr } from "./filesystem/metadata.js";
import { createFilesystemService } from "./filesystem/service.js";
import { handleFiles } from "./http/files.js";
import { handleFilesCompose } from "./http/files-compose.js";
import { handleLeases, LEASES_PATH } from "./http/leases.js";
import { MetricsSampler } from "./http/metrics.js";
import { sendJson, sendJsonError } from "./http/respond.js";
import { createProcessService } from "./process/service.js";
import { relabelUnaryDecodeErrors, streamDecodeErrors } from "./rpc-decode-errors.js";
import { warmUp } from "./warmup.js";

/**
 * Everything envd serves besides `/health` and `/init`: the Connect services, `/files`, the leases, the metrics.
 * Loaded by server.ts through a dynamic import once envd listens, so its modules (the protobuf descriptors, Connect,
 * the spawner) are evaluated after a cold start's `/init` has been answered instead of before envd can listen.
 */
export interface EnvdServices {
  /** Answers a request that is not `/health`, `/init` or a CORS preflight. */
  handle(req: IncomingMessage, res: ServerResponse, path: string): Promise<void>;
  /** Runs envd's warm-up (warmup.ts) against its own port, then loads the metadata addon; best effort. */
  warmUp(port: number, laterRounds: number): Promise<void>;
  close(): Promise<void>;
}

const UNAUTHORIZED = "unauthorized access, please provide a valid access token or method signing if supported";

export function createServices(context: EnvdContext): EnvdServices {
  const { log } = context;
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

  return {
    async handle(req, res, path) {
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
      if (path === LEASES_PATH || path.startsWith(`${LEASES_PATH}/`)) {
        return handleLeases(req, res, path, processes.leases);
      }
      rpc(req, res);
    },
    async warmUp(port, laterRounds) {
      await warmUp(port, context.state.accessToken, log, laterRounds);
      // The metadata addon too, so that a client's first file call does not load it (metadata.ts).
      try {
        loadFsXattr();
      } catch (error) {
        log.warn("could not load fs-xattr", { error: (error as Error).message });
      }
    },
    async close() {
      await Promise.all([processes.close(), filesystem.close()]);
    },
  };
}
