import { timingSafeEqual } from "node:crypto";
import type { Client } from "@connectrpc/connect";
import type { MasterService } from "@warren/proto/master/v1/master_pb";
import { isSandboxId } from "@warren/proto/redis";
import { type Request, type Response, Router } from "express";
import { ApiError, badRequest, fromMasterError, sandboxNotFound } from "./errors.js";

/** Header carrying WARREN_INTERNAL_TOKEN on calls from Warren's own services (the proxy). */
export const INTERNAL_TOKEN_HEADER = "X-Warren-Internal-Token";

function sameToken(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** 401 unless the request carries the internal token (compared in constant time). */
export function requireInternalToken(req: Request, internalToken: string): void {
  if (!sameToken(req.get(INTERNAL_TOKEN_HEADER) ?? "", internalToken)) {
    throw new ApiError(401, `missing or invalid ${INTERNAL_TOKEN_HEADER}`);
  }
}

/**
 * Calls from Warren's own services, authenticated by a shared token (WARREN_INTERNAL_TOKEN); without a token
 * configured none of these paths exist.
 *
 * `POST /warren/v1/internal/sandboxes/{id}/resume` — the proxy's auto-resume. Body: `{port, trafficAccessToken?,
 * envdAccessToken?}` (the header values the client sent). 200 `{resumed}` once the sandbox runs again (its new
 * route is already in Redis); 404 when auto-resume does not apply, 403 wrong tokens, 409 still transitioning.
 */
export function internalRoutes(master: Client<typeof MasterService>, internalToken: string): Router {
  const router = Router();
  if (!internalToken) return router;
  router.post("/warren/v1/internal/sandboxes/:sandboxID/resume", async (req: Request, res: Response) => {
    if (!sameToken(req.get(INTERNAL_TOKEN_HEADER) ?? "", internalToken)) {
      throw new ApiError(401, `missing or invalid ${INTERNAL_TOKEN_HEADER}`);
    }
    const id = String(req.params.sandboxID);
    if (!isSandboxId(id)) throw sandboxNotFound(id);
    const obj = (req.body ?? {}) as Record<string, unknown>;
    const port = obj.port;
    if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65535) {
      throw badRequest("port must be an integer from 1 to 65535");
    }
    const text = (value: unknown) => (typeof value === "string" ? value : "");
    try {
      const result = await master.resumeOnTraffic(
        {
          sandboxId: id,
          port,
          trafficAccessToken: text(obj.trafficAccessToken),
          envdAccessToken: text(obj.envdAccessToken),
        },
        { timeoutMs: 120_000 },
      );
      res.status(200).json({ resumed: result.resumed });
    } catch (error) {
      throw fromMasterError(error);
    }
  });
  return router;
}
