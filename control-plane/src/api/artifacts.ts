import { createHmac, timingSafeEqual } from "node:crypto";
import { posix } from "node:path";
import { type Client, Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "@warren/platform/log";
import type { MasterService } from "@warren/proto/master/v1/master_pb";
import type { ApiSchema } from "@warren/proto/openapi";
import { type Request, type Response, Router } from "express";
import {
  type ArtifactFormat,
  type ArtifactRow,
  deleteArtifact,
  digestInUse,
  evictOverRetention,
  getArtifact,
  insertArtifact,
  listArtifacts,
  lockDigest,
  newArtifactId,
} from "../store/artifacts.js";
import { type Db, withTransaction } from "../store/db.js";
import { appendEvent } from "../store/events.js";
import { getVisibleSandbox } from "../store/sandboxes.js";
import { ArtifactBlobs, type StagedBlob } from "./artifact-blobs.js";
import type { ArtifactConfig } from "./config.js";
import { ApiError, badRequest, fromMasterError, sandboxNotFound } from "./errors.js";
import { parseRequestBody } from "./openapi-requests.js";
import { sandboxId, team } from "./sandboxes.js";

export interface ArtifactRoutesDeps {
  readonly db: Db;
  readonly master: Client<typeof MasterService>;
  readonly log: Logger;
  readonly artifacts: ArtifactConfig;
}

const MAX_PATH_CHARS = 4096;
const STALE_STAGING_MS = 60 * 60_000;
const DEFAULT_URL_TTL_SECONDS = 15 * 60;
const DEFAULT_LIST = 100;
const MAX_LIST = 1000;
const CONTENT_TYPES: Record<ArtifactFormat, string> = { tar: "application/x-tar", zip: "application/zip" };

function artifactNotFound(id: string): ApiError {
  return new ApiError(404, `artifact '${id.slice(0, 64)}' not found`);
}

/** The API's view of an artifact. */
function artifactView(row: ArtifactRow): ApiSchema<"Artifact"> {
  return {
    artifactID: row.id,
    sandboxID: row.sandboxId,
    path: row.path,
    format: row.format,
    sizeBytes: row.sizeBytes,
    sha256: row.sha256,
    createdAt: row.createdAt.toISOString(),
  };
}

/** The path to freeze, normalised; the document has checked it is a non-empty string. */
function parsePath(value: string): string {
  if (value.length > MAX_PATH_CHARS) throw badRequest(`path is longer than ${MAX_PATH_CHARS} characters`);
  if (!value.startsWith("/")) throw badRequest(`path '${value.slice(0, 200)}' must be absolute (start with /)`);
  if (value.includes("\0")) throw badRequest("path must not contain a NUL byte");
  const path = posix.normalize(value).replace(/\/+$/, "");
  if (path === "") throw badRequest("path '/' is the whole sandbox; name a file or folder in it");
  return path;
}

function parseIntParam(value: unknown, name: string, fallback: number, max: number): number {
  if (value === undefined || value === null) return fallback;
  const n = typeof value === "string" ? Number(value) : value;
  if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > max) {
    throw badRequest(`${name} must be an integer from 1 to ${max}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/** The signature of a download URL: it names one artifact and one expiry, nothing else. */
function sign(key: Buffer, id: string, expires: number): string {
  return createHmac("sha256", key).update(`${id}.${expires}`).digest("base64url");
}

function sameSignature(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The master's archive stream as bytes; fails unless it ends with its `done`. */
async function* archiveChunks(stream: AsyncIterable<{ event: { case: string | undefined; value?: unknown } }>) {
  for await (const message of stream) {
    if (message.event.case === "chunk") yield message.event.value as Uint8Array;
    else if (message.event.case === "done") return;
  }
  throw new ApiError(502, "the master ended the archive stream early");
}

function publishError(error: unknown, path: string, maxBytes: number): ApiError {
  if (error instanceof ApiError) return error;
  if (error instanceof ConnectError && error.code === Code.ResourceExhausted) {
    return new ApiError(413, `'${path}' archives to more than the ${maxBytes} bytes an artifact may have`);
  }
  return fromMasterError(error);
}

/**
 * Artifacts: a file or folder of a running sandbox frozen into a tar (or zip) at the moment of the publish,
 * kept by the api outside the sandbox (ArtifactBlobs, by digest) and recorded in PostgreSQL with the ledger event
 * `artifact.published`. Artifacts outlive their sandbox; they go when deleted or when the team's retention limit
 * (count or bytes) drops the oldest. Another team's artifact is a 404 everywhere.
 */
export class ArtifactService {
  readonly blobs: ArtifactBlobs;

  constructor(private readonly deps: ArtifactRoutesDeps) {
    this.blobs = new ArtifactBlobs(deps.artifacts.dir);
    // Far older than any publish runs (the master gives tar 10 minutes): left by an api that died mid-publish.
    this.blobs.sweepStaging(STALE_STAGING_MS).then(
      (removed) => {
        if (removed > 0) deps.log.info("stale artifact staging files removed", { count: removed });
      },
      (error: unknown) => deps.log.warn("sweeping artifact staging failed", { error }),
    );
  }

  get maxBytes(): number {
    return this.deps.artifacts.maxMB * 2 ** 20;
  }

  async publish(
    teamId: string,
    sandbox: string,
    path: string,
    format: ArtifactFormat,
    signal: AbortSignal,
  ): Promise<ArtifactRow> {
    const { db, master } = this.deps;
    let tar: StagedBlob;
    try {
      const stream = master.exportSandboxPath(
        { teamId, sandboxId: sandbox, path, maxBytes: BigInt(this.maxBytes) },
        { signal },
      );
      tar = await this.blobs.stage(archiveChunks(stream), "tar");
    } catch (error) {
      throw publishError(error, path, this.maxBytes);
    }
    let staged = tar;
    if (format === "zip") {
      try {
        staged = await this.blobs.zipFromTar(tar);
      } finally {
        await this.blobs.discard(tar.file);
      }
    }
    const id = newArtifactId();
    const { row, evicted } = await withTransaction(db, async (tx) => {
      await lockDigest(tx, staged.sha256);
      await this.blobs.commit(staged);
      const row = await insertArtifact(tx, {
        id,
        teamId,
        sandboxId: sandbox,
        path,
        format,
        sizeBytes: staged.sizeBytes,
        sha256: staged.sha256,
      });
      const data = { artifactId: id, path, format, sizeBytes: staged.sizeBytes, sha256: staged.sha256 };
      await appendEvent(tx, { sandboxId: sandbox, teamId, type: "artifact.published", data });
      const limit = {
        maxCount: this.deps.artifacts.retentionCount,
        maxBytes: this.deps.artifacts.retentionMB * 2 ** 20,
      };
      const evicted = await evictOverRetention(tx, teamId, limit, id);
      for (const old of evicted) {
        await appendEvent(tx, {
          sandboxId: old.sandboxId,
          teamId,
          type: "artifact.deleted",
          data: { artifactId: old.id, reason: "retention" },
        });
      }
      return { row, evicted };
    }).catch(async (error: unknown) => {
      // The blob may be another artifact's too: only an unreferenced one goes.
      await this.release(staged.sha256).catch(() => undefined);
      throw error;
    });
    for (const old of evicted) await this.release(old.sha256);
    this.deps.log.info("artifact published", {
      sandboxId: sandbox,
      teamId,
      artifactId: id,
      format,
      sizeBytes: row.sizeBytes,
      evicted: evicted.length,
    });
    return row;
  }

  async remove(teamId: string, id: string): Promise<boolean> {
    const removed = await withTransaction(this.deps.db, async (tx) => {
      const row = await deleteArtifact(tx, id, teamId);
      if (row) {
        await appendEvent(tx, {
          sandboxId: row.sandboxId,
          teamId,
          type: "artifact.deleted",
          data: { artifactId: row.id, reason: "deleted" },
        });
      }
      return row;
    });
    if (!removed) return false;
    await this.release(removed.sha256);
    return true;
  }

  /** Removes the blob of `sha256` unless an artifact still refers to it. */
  private async release(sha256: string): Promise<void> {
    await withTransaction(this.deps.db, async (tx) => {
      await lockDigest(tx, sha256);
      if (!(await digestInUse(tx, sha256))) await this.blobs.remove(sha256);
    });
  }

  /** A download path for `id` signed until `expires` (unix seconds); 503 without a signing key. */
  signedPath(id: string, expires: number): string {
    const key = this.urlKey();
    return `/warren/v1/artifacts/${id}/download?expires=${expires}&sig=${sign(key, id, expires)}`;
  }

  /** Checks a download URL's expiry and signature (403 naming which failed). */
  verify(id: string, expiresRaw: unknown, sig: unknown): void {
    const key = this.urlKey();
    if (typeof expiresRaw !== "string" || !/^\d{1,12}$/.test(expiresRaw) || typeof sig !== "string") {
      throw new ApiError(403, "download URL is not signed: expected ?expires=<unix seconds>&sig=<signature>");
    }
    const expires = Number(expiresRaw);
    if (!sameSignature(sig, sign(key, id, expires))) {
      throw new ApiError(403, `download URL signature does not match artifact '${id.slice(0, 64)}'`);
    }
    if (expires * 1000 < Date.now()) {
      throw new ApiError(403, `download URL expired at ${new Date(expires * 1000).toISOString()}`);
    }
  }

  private urlKey(): Buffer {
    const key = this.deps.artifacts.urlKey;
    if (!key) {
      throw new ApiError(503, "artifact download URLs need WARREN_ARTIFACT_URL_KEY (or WARREN_INTERNAL_TOKEN) set");
    }
    return key;
  }
}

/** `GET /warren/v1/artifacts/{id}/download?expires=&sig=`: no API key, the signature is the authorization. */
export function artifactDownloadRoutes(service: ArtifactService, db: Db): Router {
  const router = Router();
  router.get("/warren/v1/artifacts/:artifactID/download", async (req: Request, res: Response) => {
    const id = String(req.params.artifactID);
    service.verify(id, req.query.expires, req.query.sig);
    const row = await getArtifact(db, id);
    if (!row) throw artifactNotFound(id);
    const blob = await service.blobs.open(row.sha256);
    if (!blob) throw new ApiError(410, `the bytes of artifact '${id}' are gone from the artifact store`);
    const name = `${posix.basename(row.path)}.${row.format}`.replace(/[^A-Za-z0-9._-]/g, "_");
    res.status(200);
    res.setHeader("Content-Type", CONTENT_TYPES[row.format]);
    res.setHeader("Content-Length", String(blob.sizeBytes));
    res.setHeader("Content-Disposition", `attachment; filename="${name}"`);
    res.setHeader("Repr-Digest", `sha-256=:${Buffer.from(row.sha256, "hex").toString("base64")}:`);
    res.setHeader("Cache-Control", "private, no-store");
    blob.stream.on("error", () => res.destroy());
    res.on("close", () => blob.stream.destroy());
    blob.stream.pipe(res);
  });
  return router;
}

/** The API-key routes: publish, list, inspect, sign a download URL, delete. */
export function artifactRoutes(service: ArtifactService, db: Db): Router {
  const router = Router();

  router.post("/warren/v1/sandboxes/:sandboxID/artifacts", async (req: Request, res: Response) => {
    const id = sandboxId(req);
    const obj = parseRequestBody("/warren/v1/sandboxes/{sandboxID}/artifacts", "post", req.body, (problem) =>
      problem.field === "path" && problem.keyword !== "maxLength" ? "path must be a non-empty string" : undefined,
    );
    const path = parsePath(obj.path);
    const format: ArtifactFormat = obj.format ?? "tar";
    const teamId = team(res).id;
    if (!(await getVisibleSandbox(db, teamId, id))) throw sandboxNotFound(id);
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    const row = await service.publish(teamId, id, path, format, abort.signal);
    res.status(201).json(artifactView(row));
  });

  router.get("/warren/v1/sandboxes/:sandboxID/artifacts", async (req: Request, res: Response) => {
    const id = sandboxId(req);
    const limit = parseIntParam(req.query.limit, "limit", DEFAULT_LIST, MAX_LIST);
    res.status(200).json((await listArtifacts(db, team(res).id, id, limit)).map(artifactView));
  });

  router.get("/warren/v1/artifacts", async (req: Request, res: Response) => {
    const limit = parseIntParam(req.query.limit, "limit", DEFAULT_LIST, MAX_LIST);
    res.status(200).json((await listArtifacts(db, team(res).id, undefined, limit)).map(artifactView));
  });

  router.get("/warren/v1/artifacts/:artifactID", async (req: Request, res: Response) => {
    const id = String(req.params.artifactID);
    const row = await getArtifact(db, id, team(res).id);
    if (!row) throw artifactNotFound(id);
    res.status(200).json(artifactView(row));
  });

  router.post("/warren/v1/artifacts/:artifactID/url", async (req: Request, res: Response) => {
    const id = String(req.params.artifactID);
    const ttl =
      parseRequestBody("/warren/v1/artifacts/{artifactID}/url", "post", req.body).expiresInSeconds ??
      DEFAULT_URL_TTL_SECONDS;
    const row = await getArtifact(db, id, team(res).id);
    if (!row) throw artifactNotFound(id);
    const expires = Math.floor(Date.now() / 1000) + ttl;
    const path = service.signedPath(row.id, expires);
    res.status(201).json({
      path,
      url: `${req.protocol}://${req.get("host")}${path}`,
      expiresAt: new Date(expires * 1000).toISOString(),
    });
  });

  router.delete("/warren/v1/artifacts/:artifactID", async (req: Request, res: Response) => {
    const id = String(req.params.artifactID);
    if (!(await service.remove(team(res).id, id))) throw artifactNotFound(id);
    res.status(204).end();
  });

  return router;
}
