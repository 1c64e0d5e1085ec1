import { createHash } from "node:crypto";
import { type Request, type Response, Router } from "express";
import { withTransaction } from "../store/db.js";
import { putFiles, takeUploadLink } from "../store/template-files.js";
import { ApiError, badRequest } from "./errors.js";
import type { TemplateRoutesDeps } from "./templates.js";

/** Path of the signed upload links the files handshake hands out (no API key: the token authorizes). */
export const UPLOAD_PATH = "/warren/v1/template-uploads";
/** How much of an over-limit upload is read and dropped to answer 413 cleanly. */
const DRAIN_MAX_BYTES = 64 * 1024 * 1024;

/**
 * The signed upload of a COPY archive (the SDK sends no API key): the one-time token in the path authorizes one
 * team and hash for 30 minutes. The body must be a tar archive (gzip or plain) no larger than the limit.
 */
export function templateUploadRoute(deps: TemplateRoutesDeps): Router {
  const router = Router();
  router.put(`${UPLOAD_PATH}/:token`, async (req: Request, res: Response) => {
    const token = String(req.params.token);
    if (!/^[A-Za-z0-9_-]{20,100}$/.test(token)) throw new ApiError(403, "invalid or expired upload link");
    const declared = Number(req.get("content-length") ?? Number.NaN);
    // Over the limit: the rest of the body is read and dropped (up to a bound), so the client gets its 413 rather
    // than a reset connection; beyond the bound the connection closes after the answer.
    const tooLarge = (what: string) =>
      new ApiError(413, `${what} is larger than the limit of ${deps.maxUploadBytes} bytes`);
    const drainBound = deps.maxUploadBytes + DRAIN_MAX_BYTES;
    if (declared > drainBound) {
      res.setHeader("Connection", "close");
      throw tooLarge(`upload of ${declared} bytes`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of req) {
      size += (chunk as Buffer).length;
      if (size > drainBound) {
        res.setHeader("Connection", "close");
        throw tooLarge("upload");
      }
      if (size <= deps.maxUploadBytes) chunks.push(chunk as Buffer);
    }
    if (size > deps.maxUploadBytes) throw tooLarge(`upload of ${size} bytes`);
    const data = Buffer.concat(chunks);
    if (!looksLikeArchive(data)) throw badRequest("the upload is not a tar archive (gzip-compressed or plain)");
    const tokenHash = createHash("sha256").update(token).digest("hex");
    const link = await withTransaction(deps.db, async (tx) => {
      const taken = await takeUploadLink(tx, tokenHash);
      if (taken) await putFiles(tx, taken.teamId, taken.hash, data);
      return taken;
    });
    if (!link) throw new ApiError(403, "invalid or expired upload link");
    res.status(200).end();
  });
  return router;
}

/** A gzip stream, or a ustar/GNU tar header (magic at offset 257), or an empty archive of zero blocks. */
function looksLikeArchive(data: Buffer): boolean {
  if (data.length >= 2 && data[0] === 0x1f && data[1] === 0x8b) return true;
  if (data.length >= 512 && data.subarray(257, 262).toString("latin1") === "ustar") return true;
  return data.length >= 1024 && data.length % 512 === 0 && data.subarray(0, 1024).every((b) => b === 0);
}
