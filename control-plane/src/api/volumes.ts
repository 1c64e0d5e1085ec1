import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import express, { type NextFunction, type Request, type Response, Router } from "express";
import { createVolumeImage, isVolumeImage, mountVolumeImage, removeVolumeImage } from "../runtime/volume-images.js";
import type { Db } from "../store/db.js";
import type { Team } from "../store/teams.js";
import {
  deleteVolume,
  findVolume,
  insertVolume,
  issueVolumeToken,
  listVolumes,
  type VolumeRow,
  volumeForToken,
} from "../store/volumes.js";
import { ApiError, badRequest } from "./errors.js";
import { parseRequestBody } from "./openapi-requests.js";
import { readVolumeFile, runVolumeOp, type VolumeOpOptions } from "./volume-fs.js";

export interface VolumeSettings {
  /** WARREN_VOLUMES_DIR: `<dir>/<team>/<volume id>` holds a volume's files. */
  readonly dir: string;
  /** A new volume's quota (bytes), enforced on content-API writes (and on every write with `images`). */
  readonly quotaBytes: number;
  /** New volumes are filesystems of their quota's size (runtime/volume-images.ts); existing ones stay as made. */
  readonly images: boolean;
}

export interface VolumeRoutesDeps {
  readonly db: Db;
  readonly log: Logger;
  /** null: this deployment has no shared folder for volumes (WARREN_VOLUMES_DIR empty). */
  readonly volumes: VolumeSettings | null;
}

function enabled(deps: VolumeRoutesDeps): VolumeSettings {
  if (!deps.volumes) throw new ApiError(403, "volumes are not enabled on this deployment (WARREN_VOLUMES_DIR)");
  return deps.volumes;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const TOKEN_TTL_MS = 24 * 3600_000;
const MAX_DEPTH = 10;

/** Where a volume's files live (the same path on the api and on every node agent). */
export function volumeDir(settings: VolumeSettings, volume: Pick<VolumeRow, "teamId" | "id">): string {
  return join(settings.dir, volume.teamId, volume.id);
}

/** A volume's files (its filesystem image too): gone whatever held them. */
async function removeVolumeFiles(dir: string): Promise<void> {
  if (isVolumeImage(dir)) await removeVolumeImage(dir);
  else await rm(dir, { recursive: true, force: true });
}

function volumeId(req: Request): string {
  const id = String(req.params.volumeID);
  if (!UUID.test(id)) throw badRequest(`volume id must be a UUID, got '${id.slice(0, 80)}'`);
  return id.toLowerCase();
}

const team = (res: Response) => res.locals.team as Team;

/**
 * E2B's volume control plane (`Volume.create|list|getInfo|connect|destroy`, API key): a volume is a team's
 * persistent folder; every create, info and connect hands out a fresh token for its content API.
 */
export function volumeRoutes(deps: VolumeRoutesDeps): Router {
  const router = Router();
  const withToken = async (volume: VolumeRow) => ({
    volumeID: volume.id,
    name: volume.name,
    token: await issueVolumeToken(deps.db, volume, TOKEN_TTL_MS),
  });

  router.post("/volumes", async (req: Request, res: Response) => {
    const settings = enabled(deps);
    const { name } = parseRequestBody("/volumes", "post", req.body, (problem) =>
      problem.field === "name"
        ? `Invalid volume name ${JSON.stringify(problem.value)}: 1-63 letters, digits, '_' or '-'`
        : undefined,
    );
    const volume = await insertVolume(deps.db, team(res).id, name, settings.quotaBytes);
    if (!volume) throw badRequest(`Volume with name '${name}' already exists`);
    const dir = volumeDir(settings, volume);
    try {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      if (settings.images) {
        await createVolumeImage(dir, volume.quotaBytes).catch((error: Error) => {
          throw new ApiError(500, `making the volume's filesystem failed (WARREN_VOLUME_IMAGES): ${error.message}`);
        });
      }
      // Sandboxes see the root as on-disk ids (an idmapped mount): anyone may create entries there, as on E2B.
      await runVolumeOp(dir, "chmeta", "/", { mode: 0o777, uid: 0, gid: 0 });
    } catch (error) {
      await removeVolumeFiles(dir).catch(() => undefined);
      await deleteVolume(deps.db, volume.teamId, volume.id);
      throw error;
    }
    res.status(201).json(await withToken(volume));
  });

  router.get("/volumes", async (_req: Request, res: Response) => {
    enabled(deps);
    const volumes = await listVolumes(deps.db, team(res).id);
    res.status(200).json(volumes.map((v) => ({ volumeID: v.id, name: v.name })));
  });

  router.get("/volumes/:volumeID", async (req: Request, res: Response) => {
    enabled(deps);
    const id = volumeId(req);
    const volume = await findVolume(deps.db, team(res).id, id);
    if (!volume) throw new ApiError(404, `Volume ${id} not found`);
    res.status(200).json(await withToken(volume));
  });

  router.delete("/volumes/:volumeID", async (req: Request, res: Response) => {
    const settings = enabled(deps);
    const id = volumeId(req);
    const teamId = team(res).id;
    if (!(await deleteVolume(deps.db, teamId, id))) throw new ApiError(404, `Volume ${id} not found`);
    res.status(204).end();
    // The row is gone (the name is free); the files follow. Sandboxes that mount it keep what they hold open.
    await removeVolumeFiles(volumeDir(settings, { teamId, id })).catch((error) =>
      deps.log.warn("removing a deleted volume's files failed", { volumeId: id, error: String(error) }),
    );
  });

  return router;
}

function queryValue(req: Request, name: string): string | undefined {
  const value = req.query[name];
  if (value === undefined) return undefined;
  if (typeof value !== "string") throw badRequest(`query parameter '${name}' may be given once`);
  return value;
}

function queryInt(req: Request, name: string, min: number, max: number): number | undefined {
  const raw = queryValue(req, name);
  if (raw === undefined || raw === "") return undefined;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw badRequest(`${name} must be an integer from ${min} to ${max}, got '${raw.slice(0, 40)}'`);
  }
  return value;
}

function queryBool(req: Request, name: string): boolean {
  const raw = queryValue(req, name);
  if (raw === undefined || raw === "" || raw === "false") return false;
  if (raw === "true") return true;
  throw badRequest(`${name} must be true or false, got '${raw.slice(0, 40)}'`);
}

function contentPath(req: Request): string {
  const path = queryValue(req, "path");
  if (path === undefined || path === "") throw badRequest("query parameter 'path' is required");
  if (path.includes("\0")) throw badRequest("path must not contain NUL");
  if (Buffer.byteLength(path) > 4096) throw badRequest("path is longer than 4096 bytes");
  return path;
}

function ownership(req: Request): VolumeOpOptions {
  const uid = queryInt(req, "uid", 0, 65535);
  const gid = queryInt(req, "gid", 0, 65535);
  const mode = queryInt(req, "mode", 0, 0o7777);
  return {
    ...(uid !== undefined ? { uid } : {}),
    ...(gid !== undefined ? { gid } : {}),
    ...(mode !== undefined ? { mode } : {}),
  };
}

/**
 * E2B's volume content API (`Authorization: Bearer <token>` of one volume, no API key): list, makeDir, stat,
 * chmod/chown, read, write, remove — each run chrooted into the volume's folder (`volume-fs.ts`). Errors carry a
 * string `code`, as E2B's volume service sends them.
 */
export function volumeContentRoutes(deps: VolumeRoutesDeps): Router {
  const router = Router();

  const open = async (req: Request): Promise<{ volume: VolumeRow; dir: string; image: boolean }> => {
    const settings = enabled(deps);
    const id = volumeId(req);
    const auth = req.get("Authorization") ?? "";
    const token = /^Bearer (\S+)$/.exec(auth)?.[1];
    if (!token) throw new ApiError(401, "Missing volume token: set Authorization: Bearer <token>", "401");
    const volume = await volumeForToken(deps.db, id, token);
    if (!volume) throw new ApiError(401, "Invalid or expired volume token for this volume", "401");
    const dir = volumeDir(settings, volume);
    // An image volume's filesystem is mounted again after a reboot; its own size is then its quota.
    const image = await mountVolumeImage(dir).catch((error: Error) => {
      throw new ApiError(503, `volume ${id} cannot be opened: ${error.message}`);
    });
    return { volume, dir, image };
  };

  router.get("/volumecontent/:volumeID/dir", async (req: Request, res: Response) => {
    const { dir } = await open(req);
    const depth = queryInt(req, "depth", 1, MAX_DEPTH) ?? 1;
    res.status(200).json(await runVolumeOp(dir, "list", contentPath(req), { depth }));
  });

  router.post("/volumecontent/:volumeID/dir", async (req: Request, res: Response) => {
    const { dir } = await open(req);
    const options = { ...ownership(req), force: queryBool(req, "force") };
    res.status(201).json(await runVolumeOp(dir, "mkdir", contentPath(req), options));
  });

  router.get("/volumecontent/:volumeID/path", async (req: Request, res: Response) => {
    const { dir } = await open(req);
    res.status(200).json(await runVolumeOp(dir, "stat", contentPath(req), {}));
  });

  router.patch(
    "/volumecontent/:volumeID/path",
    express.json({ limit: "64kb", type: () => true }),
    async (req: Request, res: Response) => {
      const { dir } = await open(req);
      const body = parseRequestBody("/volumecontent/{volumeID}/path", "patch", req.body);
      const options: VolumeOpOptions = {};
      // -1 (E2B's "unchanged") is a field left out.
      for (const field of ["uid", "gid", "mode"] as const) {
        const value = body[field];
        if (value !== undefined && value !== -1) Object.assign(options, { [field]: value });
      }
      res.status(200).json(await runVolumeOp(dir, "chmeta", contentPath(req), options));
    },
  );

  router.delete("/volumecontent/:volumeID/path", async (req: Request, res: Response) => {
    const { dir } = await open(req);
    await runVolumeOp(dir, "remove", contentPath(req), {});
    res.status(204).end();
  });

  router.get("/volumecontent/:volumeID/file", async (req: Request, res: Response) => {
    const { dir } = await open(req);
    await readVolumeFile(dir, contentPath(req), () => {
      res.status(200).setHeader("Content-Type", "application/octet-stream");
      return res;
    });
  });

  router.put("/volumecontent/:volumeID/file", async (req: Request, res: Response) => {
    const { volume, dir, image } = await open(req);
    const options = {
      ...ownership(req),
      force: queryBool(req, "force"),
      // A filesystem of the quota's size refuses past it by itself (ENOSPC): no walk of the volume per write.
      ...(image ? {} : { quotaBytes: volume.quotaBytes }),
    };
    res.status(201).json(await runVolumeOp(dir, "write", contentPath(req), options, req));
  });

  // E2B's volume service words errors with a string code.
  router.use("/volumecontent", (error: unknown, _req: Request, res: Response, next: NextFunction) => {
    if (!(error instanceof ApiError) || res.headersSent) return next(error);
    res.status(error.status).json({ code: error.errorCode ?? String(error.status), message: error.message });
  });

  return router;
}
