import { timingSafeEqual } from "node:crypto";
import type { ApiSchema } from "@warren/proto/openapi";
import { type NextFunction, type Request, type Response, Router } from "express";
import type { ApiKeyIdentities } from "../store/api-key-cache.js";
import type { Db } from "../store/db.js";
import { listNodes, setNodeCordon } from "../store/nodes.js";
import {
  createApiKey,
  createTeam,
  getTeam,
  listApiKeys,
  listTeams,
  revokeApiKey,
  SHIPPED_BUILDS_TEAM,
  type TeamLimits,
  updateTeam,
} from "../store/teams.js";
import { ApiError, badRequest } from "./errors.js";
import { parseRequestBody } from "./openapi-requests.js";

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** The limits a request sets (the document's `TeamLimits`, checked); fields left out keep their value. */
function limits(body: ApiSchema<"TeamLimits">): TeamLimits {
  const { maxConcurrentSandboxes, maxLengthHours, maxCreatesPerMinute, egressMode } = body;
  return {
    ...(maxConcurrentSandboxes !== undefined ? { maxConcurrentSandboxes } : {}),
    ...(maxLengthHours !== undefined ? { maxLengthHours } : {}),
    ...(maxCreatesPerMinute !== undefined ? { maxCreatesPerMinute } : {}),
    ...(egressMode !== undefined ? { egressMode } : {}),
  };
}

/**
 * Warren extra: team and API key administration, behind `X-Admin-Token` (WARREN_ADMIN_TOKEN). Keys are shown
 * once, in the response that creates them; only their SHA-256 is stored.
 */
/** `identities`: this replica's view of keys, emptied by its own changes at once (others' on their notification). */
export function adminRoutes(db: Db, adminToken: string, identities: ApiKeyIdentities): Router {
  const router = Router();
  const guard = (req: Request, _res: Response, next: NextFunction) => {
    const given = req.get("X-Admin-Token") ?? "";
    if (!adminToken || !sameSecret(given, adminToken)) throw new ApiError(401, "Invalid admin token");
    next();
  };
  router.use("/warren/v1/admin", guard);
  /** A user's team; the reserved team of the shipped builds is none (404), so no key is ever made for it. */
  const usersTeam = async (teamId: string) => (teamId === SHIPPED_BUILDS_TEAM ? undefined : getTeam(db, teamId));

  router.post("/warren/v1/admin/teams", async (req, res) => {
    const obj = parseRequestBody("/warren/v1/admin/teams", "post", req.body);
    if (obj.name.trim() === "") throw badRequest("name is required");
    const team = await createTeam(db, obj.name, limits(obj));
    const key = await createApiKey(db, team.id, "default");
    res.status(201).json({ team, apiKey: { id: key.id, key: key.key, prefix: key.prefix } });
  });

  // Changes a team's limits and egress mode; applies to sandboxes created (or network-updated) from now on.
  router.patch("/warren/v1/admin/teams/:teamID", async (req, res) => {
    const teamId = String(req.params.teamID);
    // The body first: a bad one is 400 whichever team it names.
    const changes = limits(parseRequestBody("/warren/v1/admin/teams/{teamID}", "patch", req.body));
    const team = teamId === SHIPPED_BUILDS_TEAM ? undefined : await updateTeam(db, teamId, changes);
    if (!team) throw new ApiError(404, `team '${teamId}' not found`);
    identities.forget();
    res.status(200).json(team);
  });

  router.get("/warren/v1/admin/teams", async (_req, res) => {
    res.status(200).json(await listTeams(db));
  });

  router.post("/warren/v1/admin/teams/:teamID/api-keys", async (req, res) => {
    const teamId = String(req.params.teamID);
    if (!(await usersTeam(teamId))) throw new ApiError(404, `team '${teamId}' not found`);
    const obj = parseRequestBody("/warren/v1/admin/teams/{teamID}/api-keys", "post", req.body);
    const approver = obj.approver ?? false;
    const key = await createApiKey(db, teamId, obj.name ?? "", approver);
    res.status(201).json({ id: key.id, key: key.key, prefix: key.prefix, approver });
  });

  // The team's keys, revoked ones too: id, name and prefix to tell them apart; the key and its hash never leave.
  router.get("/warren/v1/admin/teams/:teamID/api-keys", async (req, res) => {
    const teamId = String(req.params.teamID);
    if (!(await usersTeam(teamId))) throw new ApiError(404, `team '${teamId}' not found`);
    const keys = await listApiKeys(db, teamId);
    res.status(200).json(
      keys.map((k) => ({
        ...k,
        createdAt: k.createdAt.toISOString(),
        revokedAt: k.revokedAt ? k.revokedAt.toISOString() : null,
      })),
    );
  });

  // Nodes as the master's reconciler last saw them (up/down, last heartbeat): cluster readiness for `warren up`.
  router.get("/warren/v1/admin/nodes", async (_req, res) => {
    const nodes = await listNodes(db);
    res.status(200).json(nodes.map((n) => ({ ...n, lastSeenAt: n.lastSeenAt.toISOString() })));
  });

  // An operator's cordon (maintenance without Kubernetes): no new sandboxes there; paused ones resume elsewhere.
  const cordon = (cordoned: boolean) => async (req: Request, res: Response) => {
    const nodeId = String(req.params.nodeID);
    if (!(await setNodeCordon(db, nodeId, cordoned))) throw new ApiError(404, `node '${nodeId}' not found`);
    res.status(204).end();
  };
  router.post("/warren/v1/admin/nodes/:nodeID/cordon", cordon(true));
  router.delete("/warren/v1/admin/nodes/:nodeID/cordon", cordon(false));

  router.delete("/warren/v1/admin/api-keys/:keyID", async (req, res) => {
    if (!(await revokeApiKey(db, String(req.params.keyID)))) {
      throw new ApiError(404, `api key '${req.params.keyID}' not found`);
    }
    identities.forget();
    res.status(204).end();
  });
  return router;
}
