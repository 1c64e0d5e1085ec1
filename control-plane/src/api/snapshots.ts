import type { Client } from "@connectrpc/connect";
import type { MasterService } from "@warren/proto/master/v1/master_pb";
import type { ApiSchema } from "@warren/proto/openapi";
import { type Request, type Response, Router } from "express";
import type { Db } from "../store/db.js";
import { listSnapshots, parseSnapshotRef, snapshotRef, teamNamespace } from "../store/snapshots.js";
import { ApiError, badRequest } from "./errors.js";
import { parseRequestBody } from "./openapi-requests.js";
import { master, sandboxId, team } from "./sandboxes.js";
import { parseMemoryMode } from "./validate.js";
import { sandboxResponse } from "./views.js";

export interface SnapshotRoutesDeps {
  readonly db: Db;
  readonly master: Client<typeof MasterService>;
}

function queryString(value: unknown, name: string): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string") throw badRequest(`${name} may be given once`);
  return value;
}

/**
 * E2B's snapshot and fork surface: `POST /sandboxes/{id}/snapshots` (createSnapshot), `GET /snapshots`
 * (listSnapshots), `DELETE /templates/{id}` (deleteSnapshot; Warren's built-in templates are not deletable) and
 * `POST /sandboxes/{id}/fork`. Snapshot ids follow E2B's template references: `<namespace>/<name>:default` when
 * named (namespace = the team's name, slugged), else `<id>:default`.
 */
export function snapshotRoutes(deps: SnapshotRoutesDeps): Router {
  const router = Router();

  router.post("/sandboxes/:sandboxID/snapshots", async (req: Request, res: Response) => {
    const id = sandboxId(req);
    const parsed = parseRequestBody("/sandboxes/{sandboxID}/snapshots", "post", req.body);
    const memory = parseMemoryMode(parsed);
    const result = await master(() =>
      deps.master.createSnapshot({
        teamId: team(res).id,
        sandboxId: id,
        name: parsed.name ?? "",
        ...(memory !== undefined ? { memory } : {}),
      }),
    );
    const snapshot = result.snapshot;
    if (!snapshot) throw new ApiError(500, "master answered without a snapshot");
    const answer: ApiSchema<"SnapshotInfo"> = {
      snapshotID: snapshot.snapshotRef,
      names: snapshot.names,
      // Warren: whether processes and memory are in it (false: files only; sandboxes from it boot fresh).
      memory: snapshot.memory,
      sizeBytes: Number(snapshot.sizeBytes),
    };
    res.status(201).json(answer);
  });

  router.get("/snapshots", async (req: Request, res: Response) => {
    const owner = team(res);
    const namespace = teamNamespace(owner.name);
    const limitRaw = queryString(req.query.limit, "limit");
    const limit = limitRaw === undefined ? 100 : Number(limitRaw);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
      throw badRequest(`limit must be an integer from 1 to 100, got '${limitRaw}'`);
    }
    const sandboxId = queryString(req.query.sandboxID, "sandboxID");
    const name = queryString(req.query.name, "name");
    const parsedName = name ? parseSnapshotRef(name, namespace) : undefined;
    if (name && !parsedName) {
      // Another namespace or tag names nothing of this team's.
      res.status(200).json([]);
      return;
    }
    let page: Awaited<ReturnType<typeof listSnapshots>>;
    try {
      page = await listSnapshots(deps.db, owner.id, {
        limit,
        ...(sandboxId ? { sandboxId } : {}),
        ...(parsedName ? { idOrName: parsedName.idOrName } : {}),
        ...(req.query.nextToken !== undefined ? { nextToken: queryString(req.query.nextToken, "nextToken") } : {}),
      });
    } catch (error) {
      if (error instanceof Error && error.message === "invalid nextToken") throw badRequest("nextToken is invalid");
      throw error;
    }
    if (page.nextToken) res.setHeader("X-Next-Token", page.nextToken);
    res.status(200).json(
      page.rows.map(
        (row): ApiSchema<"SnapshotInfo"> => ({
          snapshotID: snapshotRef(row, namespace),
          names: row.name ? [snapshotRef(row, namespace)] : [],
          sandboxID: row.sourceSandboxId,
          createdAt: row.createdAt.toISOString(),
          memory: row.memory,
          sizeBytes: row.sizeBytes,
        }),
      ),
    );
  });

  router.delete("/templates/:templateID", async (req: Request, res: Response) => {
    const ref = String(req.params.templateID);
    const owner = team(res);
    if (!parseSnapshotRef(ref, teamNamespace(owner.name))) {
      throw new ApiError(404, `snapshot '${ref}' not found (only snapshots can be deleted through this path)`);
    }
    await master(() => deps.master.deleteSnapshot({ teamId: owner.id, snapshotRef: ref }));
    res.status(204).end();
  });

  router.post("/sandboxes/:sandboxID/fork", async (req: Request, res: Response) => {
    const id = sandboxId(req);
    const parsed = parseRequestBody("/sandboxes/{sandboxID}/fork", "post", req.body);
    const count = parsed.count ?? 1;
    const timeout = parsed.timeout ?? 0;
    const result = await master(() =>
      deps.master.forkSandbox({ teamId: team(res).id, sandboxId: id, count, timeoutSeconds: timeout }),
    );
    res.setHeader("X-Warren-Fork-Memory", String(result.memory));
    res
      .status(201)
      .json(
        result.results.map(
          (r): ApiSchema<"ForkResult"> =>
            r.sandbox
              ? { sandbox: sandboxResponse(r.sandbox) }
              : { error: { code: r.errorCode, message: r.errorMessage } },
        ),
      );
  });

  return router;
}
