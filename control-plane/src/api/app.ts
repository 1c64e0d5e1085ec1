import { randomUUID } from "node:crypto";
import type { Client } from "@connectrpc/connect";
import type { Logger } from "@warren/platform/log";
import type { MasterService } from "@warren/proto/master/v1/master_pb";
import { OPENAPI_DOCUMENT } from "@warren/proto/openapi";
import express, { type NextFunction, type Request, type Response } from "express";
import { type ApiKeyIdentities, UncachedApiKeyIdentities } from "../store/api-key-cache.js";
import type { Db } from "../store/db.js";
import type { SecretKeyRing } from "../store/secret-box.js";
import { adminRoutes } from "./admin.js";
import { ArtifactService, artifactDownloadRoutes, artifactRoutes } from "./artifacts.js";
import type { ArtifactConfig } from "./config.js";
import { type ConsoleConfig, consoleRoutes, loadConsoleConfig } from "./console.js";
import { ecrLogin } from "./ecr-login.js";
import { ApiError, sendError } from "./errors.js";
import { eventRoutes } from "./events.js";
import { execPolicyInternalRoutes, execPolicyRoutes } from "./exec-policy.js";
import { rejectUnsafeInput } from "./input-guard.js";
import { internalRoutes } from "./internal.js";
import type { ApiMetrics } from "./metrics.js";
import { sandboxRoutes } from "./sandboxes.js";
import { secretInternalRoutes, secretRoutes } from "./secrets.js";
import { snapshotRoutes } from "./snapshots.js";
import { templateUploadRoute } from "./template-uploads.js";
import { templateRoutes } from "./templates.js";
import { type VolumeSettings, volumeContentRoutes, volumeRoutes } from "./volumes.js";

export interface AppDeps {
  readonly db: Db;
  readonly master: Client<typeof MasterService>;
  readonly metrics: ApiMetrics;
  readonly log: Logger;
  readonly adminToken: string;
  /** WARREN_INTERNAL_TOKEN: enables the internal paths (the proxy's auto-resume); empty disables them. */
  readonly internalToken?: string;
  /** WARREN_SECRETS_KEYS: seals secrets at rest; without it the secrets API answers 503. */
  readonly secretKeys?: SecretKeyRing;
  readonly streams: Set<() => void>;
  /** The web console (WARREN_CONSOLE_*); default: the bundle in this repository, no sandbox URL. */
  readonly console?: ConsoleConfig;
  readonly ssePollMs?: number;
  /** Largest template COPY archive accepted (bytes); default 256 MiB. */
  readonly maxUploadBytes?: number;
  /** Template builds a team may have waiting or running at once; default 5. */
  readonly maxActiveBuildsPerTeam?: number;
  /** Where AWS keys get an ECR login (WARREN_ECR_ENDPOINT); default: AWS's endpoint of the keys' region. */
  readonly ecrEndpoint?: string;
  /** Where volumes live and their quota; default /var/lib/warren/volumes, 10 GiB; null: volumes are off. */
  readonly volumes?: VolumeSettings | null;
  /** Artifacts (WARREN_ARTIFACT*); default: /var/lib/warren/artifacts, 1 GiB each, 100 or 10 GiB per team. */
  readonly artifacts?: ArtifactConfig;
  /** Who a request's API key is (WARREN_API_KEY_CACHE_MS); default: a PostgreSQL lookup per request. */
  readonly identities?: ApiKeyIdentities;
}

/** Paths answered without an API key. */
const PUBLIC = new Set(["/health", "/metrics", "/openapi.json", "/warren/v1/openapi.json"]);

export function createApp(deps: AppDeps): express.Express {
  const app = express();
  app.disable("x-powered-by");
  app.set("etag", false);

  // Request id, access log (never headers or bodies: they carry keys and tokens), metrics.
  app.use((req, res, next) => {
    const requestId = req.get("X-Request-ID") || randomUUID();
    res.setHeader("X-Request-ID", requestId);
    res.locals.requestId = requestId;
    const started = process.hrtime.bigint();
    res.on("finish", () => {
      const route = (req.route?.path as string | undefined) ?? "unmatched";
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      deps.metrics.requests.inc({ method: req.method, route, status: String(res.statusCode) });
      deps.metrics.duration.observe({ method: req.method, route }, seconds);
      deps.log.info("request", {
        requestId,
        method: req.method,
        route,
        sandboxId: req.params?.sandboxID,
        team: (res.locals.team as { id?: string } | undefined)?.id,
        status: res.statusCode,
        ms: Math.round(seconds * 1000),
      });
    });
    next();
  });

  app.get("/health", (_req, res) => {
    res.status(200).json({ status: "ok" });
  });
  app.get("/metrics", async (_req, res) => {
    res.setHeader("Content-Type", deps.metrics.registry.contentType);
    res.status(200).send(await deps.metrics.registry.metrics());
  });
  app.get(["/openapi.json", "/warren/v1/openapi.json"], (_req, res) => {
    res.status(200).json(OPENAPI_DOCUMENT);
  });
  app.use(consoleRoutes(deps.console ?? loadConsoleConfig({})));

  const templates = {
    db: deps.db,
    master: deps.master,
    maxUploadBytes: deps.maxUploadBytes ?? 256 * 1024 * 1024,
    maxActiveBuildsPerTeam: deps.maxActiveBuildsPerTeam ?? 5,
    ecrLogin: ecrLogin(deps.ecrEndpoint),
  };
  const volumes = {
    db: deps.db,
    log: deps.log,
    volumes:
      deps.volumes === undefined
        ? { dir: "/var/lib/warren/volumes", quotaBytes: 10 * 2 ** 30, images: false }
        : deps.volumes,
  };
  // Before the JSON parser and the API key check: the upload's body is an archive and its link authorizes it;
  // a volume's content API takes raw file bodies and authorizes with the volume's token.
  app.use(templateUploadRoute(templates));
  app.use(volumeContentRoutes(volumes));
  app.use(express.json({ limit: "1mb", type: () => true }));
  app.use(rejectUnsafeInput);
  const identities = deps.identities ?? new UncachedApiKeyIdentities(deps.db);
  app.use(adminRoutes(deps.db, deps.adminToken, identities));
  app.use(internalRoutes(deps.master, deps.internalToken ?? ""));
  app.use(secretInternalRoutes({ db: deps.db, secretKeys: deps.secretKeys }, deps.internalToken ?? ""));
  app.use(execPolicyInternalRoutes({ db: deps.db, master: deps.master }, deps.internalToken ?? ""));
  const artifacts = new ArtifactService({
    db: deps.db,
    master: deps.master,
    log: deps.log,
    artifacts: deps.artifacts ?? {
      dir: "/var/lib/warren/artifacts",
      maxMB: 1024,
      retentionCount: 100,
      retentionMB: 10240,
      urlKey: undefined,
    },
  });
  // Signed download links carry their own authorization (no API key): before the key check.
  app.use(artifactDownloadRoutes(artifacts, deps.db));

  app.use(async (req: Request, res: Response, next: NextFunction) => {
    if (PUBLIC.has(req.path)) return next();
    const key = req.get("X-API-KEY");
    if (!key) throw new ApiError(401, "Missing API key: set the X-API-KEY header");
    const identity = await identities.identify(key);
    if (!identity) throw new ApiError(401, "Invalid API key");
    res.locals.team = identity.team;
    res.locals.apiKey = identity;
    next();
  });
  app.use(sandboxRoutes(deps));
  app.use(templateRoutes(templates));
  app.use(snapshotRoutes(deps));
  app.use(secretRoutes({ db: deps.db, secretKeys: deps.secretKeys }));
  app.use(execPolicyRoutes({ db: deps.db, master: deps.master }));
  app.use(volumeRoutes(volumes));
  app.use(artifactRoutes(artifacts, deps.db));
  app.use(eventRoutes({ db: deps.db, pollMs: deps.ssePollMs ?? 250, streams: deps.streams }));

  app.use((req: Request, _res: Response, next: NextFunction) => {
    next(new ApiError(404, `no route for ${req.method} ${req.path}`));
  });
  app.use((error: unknown, _req: Request, res: Response, _next: NextFunction) => {
    if (res.headersSent) {
      res.end();
      return;
    }
    if (error instanceof ApiError) return sendError(res, error);
    const status = (error as { status?: number; type?: string }).status;
    if ((error as { type?: string }).type === "entity.parse.failed") {
      return sendError(res, new ApiError(400, "request body is not valid JSON"));
    }
    if (typeof status === "number" && status >= 400 && status < 500) {
      return sendError(res, new ApiError(status, error instanceof Error ? error.message : "bad request"));
    }
    const requestId = res.locals.requestId as string;
    deps.log.error("request failed", { requestId, error });
    // PostgreSQL unreachable is a transient condition the client can retry.
    const code = (error as { code?: string }).code;
    if (code === "ECONNREFUSED" || code === "57P01" || code === "ETIMEDOUT") {
      return sendError(res, new ApiError(503, "database unavailable, please retry"));
    }
    sendError(res, new ApiError(500, `internal error (request ${requestId})`, "internal_server_error"));
  });
  return app;
}
