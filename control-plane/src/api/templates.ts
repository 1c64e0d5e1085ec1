import { createHash, randomBytes, randomUUID } from "node:crypto";
import type { Client } from "@connectrpc/connect";
import type { MasterService } from "@warren/proto/master/v1/master_pb";
import { type NextFunction, type Request, type Response, Router } from "express";
import { type Db, withTransaction } from "../store/db.js";
import { teamNamespace } from "../store/snapshots.js";
import type { Team } from "../store/teams.js";
import { hasFiles, insertUploadLink } from "../store/template-files.js";
import { collectUnusedLayers } from "../store/template-layers.js";
import { findTemplateByRef, parseTag, parseTemplateName, TemplateNameError } from "../store/template-refs.js";
import { BuildSpecError, parseBuildSpec } from "../store/template-spec.js";
import { assignTags, DEFAULT_TAG, listTags, removeTags, resolveTag, tagsOfBuild } from "../store/template-tags.js";
import {
  BUILD_ENVD_VERSION,
  type BuildLogEntry,
  type BuildRecord,
  clearBuildSpec,
  deleteTemplate,
  getBuild,
  getTemplate,
  insertBuild,
  insertTemplate,
  listBuilds,
  listTeamTemplates,
  newTemplateId,
  readBuildLogs,
  setTemplatePublic,
  storeBuildSpec,
  type TemplateRecord,
  templateByAlias,
} from "../store/templates.js";
import type { EcrLogin } from "./ecr-login.js";
import { ApiError, badRequest } from "./errors.js";
import { parseRequestBody } from "./openapi-requests.js";
import { master, team } from "./sandboxes.js";
import { UPLOAD_PATH } from "./template-uploads.js";
import { buildView, logEntryView, templateView } from "./template-views.js";

export interface TemplateRoutesDeps {
  readonly db: Db;
  readonly master: Client<typeof MasterService>;
  /** Largest COPY archive accepted (bytes). */
  readonly maxUploadBytes: number;
  /** Builds a team may have waiting or running at once (more: 429). */
  readonly maxActiveBuildsPerTeam: number;
  /** `fromAWSRegistry`'s keys → an ECR login (ecr-login.ts). */
  readonly ecrLogin: EcrLogin;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const FILES_HASH = /^[0-9a-f]{64}$/;
const UPLOAD_LINK_SECONDS = 30 * 60;

function nameError<T>(fn: () => T): T {
  try {
    return fn();
  } catch (error) {
    if (error instanceof TemplateNameError) throw badRequest(error.message);
    throw error;
  }
}

function owner(res: Response) {
  const t = team(res);
  return { id: t.id, namespace: teamNamespace(t.name) };
}

/** E2B's resource rules past the document's bounds: CPU 1 or even (memory's evenness is the document's). */
function resources(b: { readonly cpuCount?: number; readonly memoryMB?: number }): {
  cpuCount: number;
  memoryMB: number;
} {
  const cpuCount = b.cpuCount ?? 2;
  if (cpuCount !== 1 && cpuCount % 2 !== 0) {
    throw badRequest(`cpuCount must be 1 or an even number up to 32, got ${cpuCount}`);
  }
  return { cpuCount, memoryMB: b.memoryMB ?? 1024 };
}

/** The template a path parameter names (id or name) for the caller: 404 when unknown, 403 when another team's. */
async function ownTemplate(db: Db, res: Response, ref: string): Promise<TemplateRecord> {
  const resolved = await findTemplateByRef(db, owner(res), ref);
  if (!resolved) throw new ApiError(404, `template '${ref}' not found`);
  if (!resolved.owned) throw new ApiError(403, `template '${ref}' belongs to another team`);
  return resolved.template;
}

/**
 * E2B's template build API (shared/E2B-TEMPLATES.md §2): create a build, the files handshake, trigger, status
 * with logs by offset, alias check, tags, list, detail, publish and delete. Bookkeeping is PostgreSQL here; the
 * master runs the build.
 */
export function templateRoutes(deps: TemplateRoutesDeps): Router {
  const router = Router();
  const { db } = deps;

  const createBuild = async (req: Request, res: Response, legacy: boolean) => {
    // The legacy create knows only alias; v3 takes name, or alias as E2B's older SDKs send it.
    const v3 = legacy ? undefined : parseRequestBody("/v3/templates", "post", req.body);
    const b = v3 ?? parseRequestBody("/v2/templates", "post", req.body);
    const rawName = v3 ? (v3.name ?? v3.alias) : b.alias;
    if (rawName === undefined || rawName === "") throw badRequest("Name is required");
    const me = owner(res);
    const name = nameError(() => parseTemplateName(rawName));
    if (name.namespace !== undefined && name.namespace !== me.namespace) {
      throw badRequest(`namespace '${name.namespace}' must match your team '${me.namespace}'`);
    }
    const extraTags = (b.tags ?? []).map((t) => nameError(() => parseTag(t)));
    const tags = [...new Set([...(name.tag ? [name.tag] : []), ...extraTags])];
    if (tags.length === 0) tags.push(DEFAULT_TAG);
    const { cpuCount, memoryMB } = resources(b);
    const result = await withTransaction(db, async (tx) => {
      await tx.query("SELECT pg_advisory_xact_lock(hashtext($1))", [`templates:${me.id}`]);
      if (await getTemplate(tx, name.alias)) {
        throw new ApiError(409, `alias '${name.alias}' is already used as a template ID`);
      }
      const active = await tx.query<{ n: string }>(
        "SELECT count(*) AS n FROM template_builds WHERE team_id = $1 AND status IN ('waiting', 'building') AND spec IS NOT NULL",
        [me.id],
      );
      if (Number(active.rows[0]?.n ?? 0) >= deps.maxActiveBuildsPerTeam) {
        throw new ApiError(
          429,
          `the team already has ${deps.maxActiveBuildsPerTeam} template builds in progress; retry when one ends`,
          undefined,
          10,
        );
      }
      const template =
        (await templateByAlias(tx, me.id, name.alias)) ??
        (await insertTemplate(
          tx,
          { id: newTemplateId(), teamId: me.id, alias: name.alias, cpuCount, memoryMB, diskSizeMB: 2048 },
          BUILD_ENVD_VERSION,
        ));
      await tx.query("UPDATE templates SET cpu_count = $2, memory_mb = $3, updated_at = now() WHERE id = $1", [
        template.id,
        cpuCount,
        memoryMB,
      ]);
      const build = await insertBuild(tx, {
        id: randomUUID(),
        templateId: template.id,
        teamId: me.id,
        cpuCount,
        memoryMB,
        diskSizeMB: template.diskSizeMB,
        envdVersion: BUILD_ENVD_VERSION,
      });
      await assignTags(tx, template.id, build.id, tags);
      return { template, build };
    });
    const view = {
      templateID: result.template.id,
      buildID: result.build.id,
      public: result.template.public,
      aliases: [name.alias],
      ...(legacy ? {} : { names: [`${me.namespace}/${name.alias}`], tags }),
    };
    res.status(202).json(view);
  };

  router.post("/v3/templates", (req, res) => createBuild(req, res, false));
  router.post("/v2/templates", (req, res) => createBuild(req, res, true));

  router.get("/templates/:templateID/files/:hash", async (req: Request, res: Response) => {
    const hash = String(req.params.hash);
    if (!FILES_HASH.test(hash)) throw badRequest(`Invalid files hash '${hash}'`);
    const template = await getTemplate(db, String(req.params.templateID));
    const me = owner(res);
    if (!template || template.teamId !== me.id) {
      throw new ApiError(404, `template '${req.params.templateID}' not found`);
    }
    const token = randomBytes(32).toString("base64url");
    await insertUploadLink(db, createHash("sha256").update(token).digest("hex"), me.id, hash, UPLOAD_LINK_SECONDS);
    const proto = (req.get("x-forwarded-proto") ?? req.protocol).split(",")[0]?.trim() || "http";
    const host = req.get("x-forwarded-host") ?? req.get("host");
    res.status(201).json({
      present: await hasFiles(db, me.id, hash),
      url: `${proto}://${host}${UPLOAD_PATH}/${token}`,
      headers: {},
    });
  });

  const buildOf = async (req: Request, res: Response): Promise<{ build: BuildRecord; template: TemplateRecord }> => {
    const buildId = String(req.params.buildID);
    if (!UUID.test(buildId)) throw badRequest(`Invalid build id '${buildId}'`);
    const build = await getBuild(db, buildId);
    const template = build ? await getTemplate(db, build.templateId) : undefined;
    if (!build || !template || build.templateId !== String(req.params.templateID)) {
      throw badRequest(`Build '${buildId}' not found`);
    }
    if (build.teamId !== team(res).id) throw new ApiError(403, `build '${buildId}' belongs to another team`);
    return { build, template };
  };

  router.post("/v2/templates/:templateID/builds/:buildID", async (req: Request, res: Response) => {
    const buildId = String(req.params.buildID);
    if (!UUID.test(buildId)) throw badRequest(`Invalid build id '${buildId}'`);
    const build = await getBuild(db, buildId);
    if (!build || build.templateId !== String(req.params.templateID)) {
      throw new ApiError(404, `build '${buildId}' of template '${req.params.templateID}' not found`);
    }
    if (build.teamId !== team(res).id) throw new ApiError(403, `build '${buildId}' belongs to another team`);
    let spec: ReturnType<typeof parseBuildSpec>;
    try {
      spec = parseBuildSpec(parseRequestBody("/v2/templates/{templateID}/builds/{buildID}", "post", req.body));
    } catch (error) {
      if (error instanceof BuildSpecError) throw badRequest(error.message);
      throw error;
    }
    if (spec.fromImageRegistry?.type === "aws" && !spec.fromImageRegistry.aws) {
      throw badRequest("fromImageRegistry type 'aws' needs awsAccessKeyId, awsSecretAccessKey and awsRegion");
    }
    if (spec.fromImageRegistry?.type === "gcp" && spec.fromImageRegistry.password === undefined) {
      throw badRequest("fromImageRegistry type 'gcp' needs serviceAccountJson (a service account key as JSON text)");
    }
    // The registry password goes to the master with the trigger; the stored steps never hold it. AWS keys are
    // exchanged for an ECR login here, before anything is stored: keys ECR refuses fail the trigger (400).
    const { fromImageRegistry: given, ...stored } = spec;
    const credentials = given?.aws ? { type: given.type, ...(await deps.ecrLogin(given.aws)) } : given;
    const storedSpec = credentials ? { ...stored, fromImageRegistry: { type: credentials.type } } : stored;
    if (!(await storeBuildSpec(db, buildId, storedSpec as unknown as Record<string, unknown>))) {
      throw badRequest(`build '${buildId}' is not in waiting state`);
    }
    // A build the master did not take stays waiting without its steps: the client may trigger it again.
    try {
      await master(() =>
        deps.master.startTemplateBuild({
          teamId: build.teamId,
          templateId: build.templateId,
          buildId,
          registryUsername: credentials?.username ?? "",
          registryPassword: credentials?.password ?? "",
        }),
      );
    } catch (error) {
      await clearBuildSpec(db, buildId);
      throw error;
    }
    res.status(202).setHeader("Content-Length", "0").end();
  });

  router.get("/templates/:templateID/builds/:buildID/status", async (req: Request, res: Response) => {
    const { build } = await buildOf(req, res);
    const offset = Number(req.query.logsOffset ?? 0);
    if (!Number.isInteger(offset) || offset < 0) throw badRequest("logsOffset must be a non-negative integer");
    const limit = Math.min(100, Number(req.query.limit ?? 100));
    if (!Number.isInteger(limit) || limit < 0) throw badRequest("limit must be a non-negative integer");
    const level = req.query.level as BuildLogEntry["level"] | undefined;
    if (level !== undefined && !["debug", "info", "warn", "error"].includes(level)) {
      throw badRequest("level must be debug, info, warn or error");
    }
    // The status first: logs read after it hold at least every entry written before it changed.
    const entries = await readBuildLogs(db, build.id, offset, limit, level);
    res.status(200).json({
      buildID: build.id,
      templateID: build.templateId,
      status: build.status,
      logs: [],
      logEntries: entries.map(logEntryView),
      ...(build.reason
        ? {
            reason: {
              message: build.reason.message,
              ...(build.reason.step ? { step: build.reason.step } : {}),
              logEntries: entries
                .filter((e) => e.level === "warn" || e.level === "error")
                .filter((e) => !build.reason?.step || e.step === build.reason.step)
                .map(logEntryView),
            },
          }
        : {}),
    });
  });

  router.get("/templates/:templateID/builds/:buildID/logs", async (req: Request, res: Response) => {
    const { build } = await buildOf(req, res);
    const cursor = Number(req.query.cursor ?? 0);
    const limit = Math.min(1000, Number(req.query.limit ?? 100));
    if (!Number.isInteger(cursor) || cursor < 0 || !Number.isInteger(limit) || limit < 1) {
      throw badRequest("cursor and limit must be non-negative integers");
    }
    const entries = await readBuildLogs(db, build.id, cursor, limit);
    res.status(200).json({ logs: entries.map(logEntryView) });
  });

  router.get("/templates/aliases/:alias", async (req: Request, res: Response) => {
    const raw = String(req.params.alias);
    const me = owner(res);
    const name = nameError(() => parseTemplateName(raw));
    if (name.namespace !== undefined && name.namespace !== me.namespace) {
      throw badRequest(`namespace '${name.namespace}' must match your team '${me.namespace}'`);
    }
    const own = await templateByAlias(db, me.id, name.alias);
    const found = own ?? (name.namespace === undefined ? await templateByAlias(db, null, name.alias) : undefined);
    if (!found) throw new ApiError(404, `template '${raw}' not found`);
    if (own && name.tag && !(await resolveTag(db, own.id, name.tag))) {
      throw new ApiError(404, `tag '${name.tag}' does not exist for template '${name.alias}'`);
    }
    res.status(200).json({ templateID: found.id, public: found.public });
  });

  router.post("/templates/tags", async (req: Request, res: Response) => {
    const b = parseRequestBody("/templates/tags", "post", req.body);
    const target = nameError(() => parseTemplateName(b.target));
    const tags = [...new Set(b.tags.map((t) => nameError(() => parseTag(t))))];
    const template = await ownTemplate(
      db,
      res,
      target.namespace ? `${target.namespace}/${target.alias}` : target.alias,
    );
    const tag = target.tag ?? DEFAULT_TAG;
    const build = await resolveTag(db, template.id, tag);
    if (!build) throw new ApiError(404, `tag '${tag}' does not exist for template '${target.alias}'`);
    await assignTags(db, template.id, build.id, tags);
    res.status(201).json({ buildID: build.id, tags });
  });

  router.delete("/templates/tags", async (req: Request, res: Response) => {
    const b = parseRequestBody("/templates/tags", "delete", req.body);
    const tags = b.tags.map((t) => nameError(() => parseTag(t)));
    if (tags.includes(DEFAULT_TAG)) throw badRequest("the tag 'default' cannot be removed");
    const template = await ownTemplate(db, res, b.name);
    const removed = await removeTags(db, template.id, tags);
    if (removed === 0) throw new ApiError(404, `none of the tags ${tags.join(", ")} exist for template '${b.name}'`);
    res.status(204).end();
  });

  router.get("/templates/:templateID/tags", async (req: Request, res: Response) => {
    const template = await ownTemplate(db, res, String(req.params.templateID));
    const tags = await listTags(db, template.id);
    res.status(200).json(tags.map((t) => ({ tag: t.tag, buildID: t.buildId, createdAt: t.createdAt.toISOString() })));
  });

  router.get(["/templates", "/v2/templates"], async (req: Request, res: Response) => {
    const me = owner(res);
    const templates = await listTeamTemplates(db, me.id);
    const views = await Promise.all(templates.map((t) => templateView(db, t, me.namespace)));
    res.status(200).json(req.path.startsWith("/v2/") ? views.reverse() : views);
  });

  router.get("/templates/:templateID", async (req: Request, res: Response) => {
    const me = owner(res);
    const template = await ownTemplate(db, res, String(req.params.templateID));
    const builds = await listBuilds(db, template.id, 100);
    res.status(200).json({
      ...(await templateView(db, template, me.namespace)),
      builds: builds.map(buildView),
      tags: builds[0] ? await tagsOfBuild(db, template.id, builds[0].id) : [],
    });
  });

  router.patch(["/templates/:templateID", "/v2/templates/:templateID"], async (req: Request, res: Response) => {
    const b = req.path.startsWith("/v2/")
      ? parseRequestBody("/v2/templates/{templateID}", "patch", req.body)
      : parseRequestBody("/templates/{templateID}", "patch", req.body);
    const me = owner(res);
    const template = await ownTemplate(db, res, String(req.params.templateID));
    if (b.public !== undefined) await setTemplatePublic(db, template.id, b.public);
    if (req.path.startsWith("/v2/")) {
      res.status(200).json({ names: template.alias ? [`${me.namespace}/${template.alias}`] : [] });
    } else res.status(200).json(null);
  });

  // A team template by id or name; anything else (a snapshot reference) goes on to the snapshot routes.
  router.delete("/templates/:templateID", async (req: Request, res: Response, next: NextFunction) => {
    const ref = String(req.params.templateID);
    const resolved = await findTemplateByRef(db, owner(res), ref);
    if (!resolved || resolved.template.teamId === null) return next();
    if (!resolved.owned) throw new ApiError(403, `template '${ref}' belongs to another team`);
    const me: Team = team(res);
    await withTransaction(db, async (tx) => {
      await deleteTemplate(tx, resolved.template.id);
      await collectUnusedLayers(tx, me.id);
    });
    res.status(204).end();
  });

  return router;
}
