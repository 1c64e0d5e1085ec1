import type { IncomingMessage, ServerResponse } from "node:http";
import { ENVD_LEASE_EVENTS_PATH, ENVD_LEASES_PATH, type EnvdLeaseEvents } from "@warren/proto/envd-http";
import { invalidArgument } from "../errors.js";
import { type LeaseBook, parseLeaseMs } from "../process/leases.js";
import { readJsonBody } from "./body.js";
import { sendJson, sendJsonError } from "./respond.js";

/** Warren's lease endpoints (behind the access token); the paths sit under /warren/ so no E2B path is touched. */
export const LEASES_PATH = ENVD_LEASES_PATH;

/**
 * `GET /warren/leases` → `{leases: [{pid, tag, ttlMs, remainingMs, expiresAt, renewals, reaping}]}`;
 * `GET /warren/leases/events?after=N` → `{events: [...]}` (the journal, for the ledger);
 * `POST /warren/leases/{pid}` `{ttlMs?}` → the renewed lease (404 when the pid holds no live lease).
 */
export async function handleLeases(
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  leases: LeaseBook,
): Promise<void> {
  if (path === LEASES_PATH && req.method === "GET") {
    sendJson(res, 200, { leases: leases.list() });
    return;
  }
  if (path === ENVD_LEASE_EVENTS_PATH && req.method === "GET") {
    const after = new URL(req.url ?? "/", "http://envd").searchParams.get("after") ?? "0";
    if (!/^\d{1,15}$/.test(after)) throw invalidArgument(`after must be a journal sequence number, got '${after}'`);
    const answer: EnvdLeaseEvents = { events: leases.events(Number(after)) };
    sendJson(res, 200, answer);
    return;
  }
  const pid = /^\/warren\/leases\/(\d{1,10})$/.exec(path)?.[1];
  if (pid !== undefined && req.method === "POST") {
    const body = (await readJsonBody(req, 4096)) as { ttlMs?: unknown } | null;
    const ttl = body?.ttlMs === undefined || body.ttlMs === null ? undefined : parseLeaseMs(body.ttlMs, "ttlMs");
    sendJson(res, 200, leases.renew(Number(pid), ttl));
    return;
  }
  sendJsonError(res, 404, `no lease route for ${req.method} ${path}`);
}
