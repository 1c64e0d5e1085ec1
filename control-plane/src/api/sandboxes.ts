import { createHash } from "node:crypto";
import type { Client } from "@connectrpc/connect";
import type { MasterService, SandboxMetric } from "@warren/proto/master/v1/master_pb";
import { networkConfigToMessage, volumeMountsToMessage } from "@warren/proto/master-requests";
import type { ApiSchema } from "@warren/proto/openapi";
import { isSandboxId } from "@warren/proto/redis";
import { type Request, type Response, Router } from "express";
import { asksForEgress } from "../runtime/egress/policy.js";
import type { Db } from "../store/db.js";
import { readEvents } from "../store/events.js";
import { encodeCursor, getVisibleSandbox, listSandboxes } from "../store/sandboxes.js";
import type { Team } from "../store/teams.js";
import { ApiError, badRequest, fromMasterError, sandboxNotFound } from "./errors.js";
import type { ApiMetrics } from "./metrics.js";
import { parseRequestBody } from "./openapi-requests.js";
import {
  type LogsQuery,
  parseConnectBody,
  parseCreateBody,
  parseListQuery,
  parseLogsQuery,
  parseMemoryMode,
  parseNetworkUpdate,
  parseTimeoutBody,
} from "./validate.js";
import { envdLogEntry, type LogEntry, listedSandbox, logEntry, sandboxDetail, sandboxResponse } from "./views.js";
import { resolveVolumeMounts } from "./volume-mounts.js";

export interface SandboxRoutesDeps {
  readonly db: Db;
  readonly master: Client<typeof MasterService>;
  readonly metrics: ApiMetrics;
}

export function team(res: Response): Team {
  return res.locals.team as Team;
}

export function sandboxId(req: Request): string {
  const id = req.params.sandboxID;
  if (typeof id !== "string" || !isSandboxId(id)) {
    // An id that cannot exist is answered like an unknown one.
    throw sandboxNotFound(String(id));
  }
  return id;
}

export async function master<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw fromMasterError(error);
  }
}

const LEVEL_RANK: Record<string, number> = { debug: 0, info: 1, warn: 2, error: 3 };

/** Sorts by time (stable: lifecycle before envd at the same instant), filters, and cuts to the query's limit. */
export function selectLogEntries(entries: LogEntry[], query: LogsQuery): LogEntry[] {
  const minLevel = LEVEL_RANK[query.level ?? "debug"] ?? 0;
  const search = query.search?.toLowerCase();
  const selected = entries
    .map((entry, index) => ({ entry, index, at: Date.parse(entry.timestamp) }))
    .filter(({ entry, at }) => {
      if ((LEVEL_RANK[entry.level] ?? 1) < minLevel) return false;
      if (search && !entry.message.toLowerCase().includes(search)) return false;
      if (query.cursorMs === undefined) return true;
      return query.direction === "backward" ? at <= query.cursorMs : at >= query.cursorMs;
    })
    .sort((a, b) => a.at - b.at || a.index - b.index)
    .map(({ entry }) => entry);
  if (query.direction === "backward") return selected.reverse().slice(0, query.limit);
  return selected.slice(0, query.limit);
}

/** A team whose egress is `forbidden` may not ask for any: 403, so nobody believes a sandbox is online. */
function refuseForbiddenEgress(
  owner: Team,
  network: Record<string, unknown> | null,
  allowInternetAccess: boolean | undefined,
): void {
  if (owner.egressMode === "forbidden" && asksForEgress(network, allowInternetAccess)) {
    throw new ApiError(
      403,
      "Your team's policy forbids network egress from sandboxes (allowOut, allow_internet_access)",
    );
  }
}

const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

/** E2B's sandbox REST surface (v1 and v2 paths), scoped to the caller's team. */
export function sandboxRoutes(deps: SandboxRoutesDeps): Router {
  const router = Router();

  const create = (version: 1 | 2) => async (req: Request, res: Response) => {
    const parsed = parseCreateBody(req.body, version);
    refuseForbiddenEgress(team(res), parsed.network, parsed.allowInternetAccess);
    const idempotencyKey = req.get("Idempotency-Key");
    if (idempotencyKey !== undefined && !IDEMPOTENCY_KEY.test(idempotencyKey)) {
      throw badRequest("Idempotency-Key must be 1-255 printable ASCII characters");
    }
    const volumeMounts = await resolveVolumeMounts(deps.db, team(res).id, parsed.volumeMounts);
    const requestHash = createHash("sha256")
      .update(`v${version}:${JSON.stringify(req.body ?? {})}`)
      .digest("hex");
    try {
      const result = await master(() =>
        deps.master.createSandbox({
          teamId: team(res).id,
          templateId: parsed.templateId,
          timeoutSeconds: parsed.timeoutSeconds,
          metadata: parsed.metadata,
          envVars: parsed.envVars,
          lifecycle: {
            autoPause: parsed.autoPause,
            autoPauseMemory: parsed.autoPauseMemory,
            autoResume: parsed.autoResume,
          },
          ...(parsed.network ? { network: networkConfigToMessage(parsed.network) } : {}),
          ...(parsed.allowInternetAccess !== undefined ? { allowInternetAccess: parsed.allowInternetAccess } : {}),
          mcpServers: parsed.mcpServers ?? [],
          volumeMounts: volumeMountsToMessage(volumeMounts),
          idempotencyKey: idempotencyKey ?? "",
          requestHash,
        }),
      );
      if (!result.sandbox) throw new ApiError(500, "master answered without a sandbox");
      deps.metrics.sandboxCreates.inc({ outcome: result.replayed ? "replayed" : "created" });
      if (result.replayed) res.setHeader("Idempotent-Replayed", "true");
      res.status(201).json(sandboxResponse(result.sandbox));
    } catch (error) {
      deps.metrics.sandboxCreates.inc({ outcome: "failed" });
      throw error;
    }
  };
  router.post("/v2/sandboxes", create(2));
  router.post("/sandboxes", create(1));

  const connect = (version: 1 | 2) => async (req: Request, res: Response) => {
    const id = sandboxId(req);
    const parsed = parseConnectBody(req.body, version);
    const result = await master(() =>
      deps.master.connectSandbox({
        teamId: team(res).id,
        sandboxId: id,
        timeoutSeconds: parsed.timeoutSeconds,
        ...(parsed.memory !== undefined ? { memory: parsed.memory } : {}),
      }),
    );
    if (!result.sandbox) throw new ApiError(500, "master answered without a sandbox");
    res.status(result.resumed ? 201 : 200).json(sandboxResponse(result.sandbox));
  };
  router.post("/v2/sandboxes/:sandboxID/connect", connect(2));
  router.post("/sandboxes/:sandboxID/connect", connect(1));

  const list = (version: 1 | 2) => async (req: Request, res: Response) => {
    const params = parseListQuery(req.query as Record<string, unknown>, version);
    const page = await listSandboxes(deps.db, { teamId: team(res).id, ...params });
    if (page.next && version === 2) res.setHeader("X-Next-Token", encodeCursor(page.next));
    res.setHeader("X-Total-Running", String(page.totalRunning));
    res.status(200).json(page.sandboxes.map(listedSandbox));
  };
  router.get("/v2/sandboxes", list(2));
  router.get("/sandboxes", list(1));

  /** One sample per running sandbox, read from its node now (see master/metrics-sampler.ts). */
  const metricsOf = async (teamId: string, id: string) => {
    const response = await master(() => deps.master.getSandboxMetrics({ teamId, sandboxId: id }));
    return response.metrics.map(metricView);
  };

  router.get("/sandboxes/metrics", async (req, res) => {
    const raw = typeof req.query.sandbox_ids === "string" ? req.query.sandbox_ids : "";
    const ids = raw.split(",").filter(Boolean);
    if (ids.length > 100) throw badRequest("at most 100 sandbox_ids");
    const sandboxes: Record<string, ReturnType<typeof metricView>> = {};
    for (const id of ids) {
      if (!(await getVisibleSandbox(deps.db, team(res).id, id))) continue;
      const latest = (await metricsOf(team(res).id, id)).at(-1);
      if (latest) sandboxes[id] = latest;
    }
    res.status(200).json({ sandboxes });
  });

  router.get("/sandboxes/:sandboxID", async (req, res) => {
    const id = sandboxId(req);
    const row = await getVisibleSandbox(deps.db, team(res).id, id);
    if (!row) throw sandboxNotFound(id);
    res.status(200).json(sandboxDetail(row));
  });

  router.delete("/sandboxes/:sandboxID", async (req, res) => {
    const id = sandboxId(req);
    await master(() => deps.master.killSandbox({ teamId: team(res).id, sandboxId: id }));
    res.status(204).end();
  });

  // Replaces the egress policy of a running or paused sandbox; 204 once the node enforces it.
  router.put("/sandboxes/:sandboxID/network", async (req, res) => {
    const id = sandboxId(req);
    const parsed = parseNetworkUpdate(req.body);
    refuseForbiddenEgress(team(res), parsed.network, parsed.allowInternetAccess);
    await master(() =>
      deps.master.updateSandboxNetwork({
        teamId: team(res).id,
        sandboxId: id,
        egress: { allowOut: [...parsed.network.allowOut], denyOut: [...parsed.network.denyOut] },
        ...(parsed.allowInternetAccess !== undefined ? { allowInternetAccess: parsed.allowInternetAccess } : {}),
      }),
    );
    res.status(204).end();
  });

  router.post("/sandboxes/:sandboxID/timeout", async (req, res) => {
    const id = sandboxId(req);
    const timeout = parseTimeoutBody(req.body);
    await master(() =>
      deps.master.setSandboxTimeout({
        teamId: team(res).id,
        sandboxId: id,
        timeoutSeconds: timeout,
        extendOnly: false,
      }),
    );
    res.status(204).end();
  });

  router.post("/sandboxes/:sandboxID/refreshes", async (req, res) => {
    const id = sandboxId(req);
    const duration = parseRequestBody("/sandboxes/{sandboxID}/refreshes", "post", req.body).duration ?? 60;
    await master(() =>
      deps.master.setSandboxTimeout({
        teamId: team(res).id,
        sandboxId: id,
        timeoutSeconds: duration,
        extendOnly: true,
      }),
    );
    res.status(204).end();
  });

  router.post("/sandboxes/:sandboxID/pause", async (req, res) => {
    const id = sandboxId(req);
    const memory = parseMemoryMode(parseRequestBody("/sandboxes/{sandboxID}/pause", "post", req.body));
    await master(() =>
      deps.master.pauseSandbox({
        teamId: team(res).id,
        sandboxId: id,
        ...(memory !== undefined ? { memory } : {}),
      }),
    );
    res.status(204).end();
  });

  // Deprecated E2B resume: 409 when the sandbox is not paused, else connect (201).
  router.post("/sandboxes/:sandboxID/resume", async (req, res) => {
    const id = sandboxId(req);
    const parsed = parseRequestBody("/sandboxes/{sandboxID}/resume", "post", req.body);
    const timeout = parsed.timeout ?? 15;
    const row = await getVisibleSandbox(deps.db, team(res).id, id);
    if (!row) throw sandboxNotFound(id);
    if (row.state === "running" || row.state === "pausing") {
      throw new ApiError(409, `Sandbox ${id} is already running`);
    }
    const result = await master(() =>
      deps.master.connectSandbox({
        teamId: team(res).id,
        sandboxId: id,
        timeoutSeconds: timeout,
        ...(parsed.memory !== undefined ? { memory: parsed.memory } : {}),
      }),
    );
    if (!result.sandbox) throw new ApiError(500, "master answered without a sandbox");
    res.status(201).json(sandboxResponse(result.sandbox));
  });

  router.get("/sandboxes/:sandboxID/metrics", async (req, res) => {
    const id = sandboxId(req);
    const row = await getVisibleSandbox(deps.db, team(res).id, id);
    if (!row) throw sandboxNotFound(id);
    const start = unixSeconds(req.query.start, "start");
    const end = unixSeconds(req.query.end, "end");
    const samples = await metricsOf(team(res).id, id);
    res
      .status(200)
      .json(
        samples.filter(
          (m) => (start === undefined || m.timestampUnix >= start) && (end === undefined || m.timestampUnix <= end),
        ),
      );
  });

  /**
   * A sandbox's log: its lifecycle events (the ledger) and its own log lines (envd, from its node while it is
   * there), merged by time, filtered by the query, `limit` entries from the start of `direction`.
   */
  const sandboxLogs = async (req: Request, res: Response, version: 1 | 2) => {
    const id = sandboxId(req);
    const row = await getVisibleSandbox(deps.db, team(res).id, id);
    if (!row) throw sandboxNotFound(id);
    const query = parseLogsQuery(req.query as Record<string, unknown>, version);
    const [events, lines] = await Promise.all([
      readEvents(deps.db, { teamId: team(res).id, sandboxId: id, limit: 1000 }),
      master(() => deps.master.getSandboxLogs({ teamId: team(res).id, sandboxId: id, limit: 1000 })),
    ]);
    return selectLogEntries([...events.map(logEntry), ...lines.lines.map(envdLogEntry)], query);
  };
  router.get("/sandboxes/:sandboxID/logs", async (req, res) => {
    const entries = await sandboxLogs(req, res, 1);
    res.status(200).json({
      logs: entries.map((e) => ({ timestamp: e.timestamp, line: e.message })),
      logEntries: entries,
    });
  });
  router.get("/v2/sandboxes/:sandboxID/logs", async (req, res) => {
    res.status(200).json({ logs: await sandboxLogs(req, res, 2) });
  });

  return router;
}

/** E2B's SandboxMetric JSON. */
function metricView(m: SandboxMetric): ApiSchema<"SandboxMetric"> {
  const ms = Number(m.timestampMs);
  return {
    timestamp: new Date(ms).toISOString(),
    timestampUnix: Math.floor(ms / 1000),
    cpuCount: m.cpuCount,
    cpuUsedPct: m.cpuUsedPct,
    memUsed: Number(m.memUsed),
    memTotal: Number(m.memTotal),
    memCache: 0,
    diskUsed: Number(m.diskUsed),
    diskTotal: Number(m.diskTotal),
  };
}

function unixSeconds(value: unknown, name: string): number | undefined {
  if (value === undefined || value === "") return undefined;
  const n = Number(value);
  if (typeof value !== "string" || !Number.isInteger(n) || n < 0) {
    throw badRequest(`${name} must be a unix timestamp in seconds, got '${String(value)}'`);
  }
  return n;
}
