import { type Request, type Response, Router } from "express";
import type { Db } from "../store/db.js";
import { readEvents, sandboxBelongsToTeam } from "../store/events.js";
import { badRequest, sandboxNotFound } from "./errors.js";
import { team } from "./sandboxes.js";
import { eventView } from "./views.js";

export interface EventRoutesDeps {
  readonly db: Db;
  /** How often an SSE follower polls the ledger when it has caught up. */
  readonly pollMs: number;
  /** Open SSE streams, closed on shutdown. */
  readonly streams: Set<() => void>;
}

function cursorOf(value: unknown): string | undefined {
  if (value === undefined || value === "") return undefined;
  if (typeof value !== "string" || !/^\d{1,19}$/.test(value)) throw badRequest(`cursor '${String(value)}' is invalid`);
  return value;
}

function limitOf(value: unknown): number {
  if (value === undefined) return 100;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 1000) throw badRequest(`limit must be 1-1000, got '${String(value)}'`);
  return n;
}

/**
 * Warren extra: the sandbox_events ledger. `GET .../events?cursor=N` pages (events with id > N);
 * `GET .../events/stream` follows it as Server-Sent Events, resuming after `Last-Event-ID` (or `?cursor=`).
 */
export function eventRoutes(deps: EventRoutesDeps): Router {
  const router = Router();

  const scope = async (req: Request, res: Response): Promise<string | undefined> => {
    const param = req.params.sandboxID;
    const id =
      typeof param === "string" ? param : typeof req.query.sandboxID === "string" ? req.query.sandboxID : undefined;
    if (id === undefined) return undefined;
    if (!(await sandboxBelongsToTeam(deps.db, team(res).id, id))) throw sandboxNotFound(id);
    return id;
  };

  const page = async (req: Request, res: Response) => {
    const sandboxId = await scope(req, res);
    const after = cursorOf(req.query.cursor);
    const events = await readEvents(deps.db, {
      teamId: team(res).id,
      limit: limitOf(req.query.limit),
      ...(sandboxId ? { sandboxId } : {}),
      ...(after ? { after } : {}),
    });
    res.status(200).json({ events: events.map(eventView), cursor: events.at(-1)?.id ?? after ?? "0" });
  };

  const stream = async (req: Request, res: Response) => {
    const sandboxId = await scope(req, res);
    let cursor = cursorOf(req.get("Last-Event-ID") ?? req.query.cursor) ?? "0";
    res.status(200);
    res.setHeader("Content-Type", "text/event-stream");
    res.setHeader("Cache-Control", "no-cache");
    res.setHeader("Connection", "keep-alive");
    res.flushHeaders();
    res.write(": following sandbox events\n\n");
    let open = true;
    let wake: (() => void) | undefined;
    const close = () => {
      open = false;
      wake?.();
      res.end();
    };
    deps.streams.add(close);
    req.on("close", () => {
      open = false;
      wake?.();
    });
    try {
      while (open) {
        const events = await readEvents(deps.db, {
          teamId: team(res).id,
          after: cursor,
          limit: 100,
          ...(sandboxId ? { sandboxId } : {}),
        });
        for (const event of events) {
          res.write(`id: ${event.id}\nevent: ${event.type}\ndata: ${JSON.stringify(eventView(event))}\n\n`);
          cursor = event.id;
        }
        if (events.length < 100) {
          await new Promise<void>((resolve) => {
            wake = resolve;
            setTimeout(resolve, deps.pollMs);
          });
        }
      }
    } catch {
      // The database went away mid-stream: end it; the client reconnects with Last-Event-ID.
    } finally {
      deps.streams.delete(close);
      if (!res.writableEnded) res.end();
    }
  };

  router.get("/warren/v1/events", page);
  router.get("/warren/v1/events/stream", stream);
  router.get("/warren/v1/sandboxes/:sandboxID/events", page);
  router.get("/warren/v1/sandboxes/:sandboxID/events/stream", stream);
  return router;
}
