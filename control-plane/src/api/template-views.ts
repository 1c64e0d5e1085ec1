import type { ApiSchema } from "@warren/proto/openapi";
import type { Db } from "../store/db.js";
import { DEFAULT_TAG, resolveTag } from "../store/template-tags.js";
import { type BuildLogEntry, type BuildRecord, listBuilds, type TemplateRecord } from "../store/templates.js";

/** E2B's answers for templates, builds and build log lines (the OpenAPI document's schemas). */

const ZERO_UUID = "00000000-0000-0000-0000-000000000000";

export function logEntryView(entry: BuildLogEntry): ApiSchema<"BuildLogEntry"> {
  return {
    timestamp: entry.timestamp.toISOString(),
    level: entry.level,
    message: entry.message,
    ...(entry.step ? { step: entry.step } : {}),
  };
}

export async function templateView(db: Db, t: TemplateRecord, namespace: string): Promise<ApiSchema<"Template">> {
  const builds = await listBuilds(db, t.id, 100);
  const defaultBuild = await resolveTag(db, t.id, DEFAULT_TAG);
  const latest = builds[0];
  return {
    templateID: t.id,
    buildID: defaultBuild?.id ?? ZERO_UUID,
    buildStatus: latest?.status ?? "waiting",
    cpuCount: t.cpuCount,
    memoryMB: t.memoryMB,
    diskSizeMB: defaultBuild?.diskSizeMB ?? t.diskSizeMB,
    envdVersion: t.envdVersion,
    public: t.public,
    names: t.alias ? [`${namespace}/${t.alias}`] : [],
    aliases: t.alias ? [t.alias] : [],
    createdAt: t.createdAt.toISOString(),
    updatedAt: t.updatedAt.toISOString(),
    lastSpawnedAt: t.lastSpawnedAt?.toISOString() ?? null,
    spawnCount: t.spawnCount,
    buildCount: builds.length,
    createdBy: null,
  };
}

export function buildView(b: BuildRecord): ApiSchema<"TemplateBuild"> {
  return {
    buildID: b.id,
    status: b.status,
    createdAt: b.createdAt.toISOString(),
    updatedAt: b.updatedAt.toISOString(),
    ...(b.finishedAt ? { finishedAt: b.finishedAt.toISOString() } : {}),
    cpuCount: b.cpuCount,
    memoryMB: b.memoryMB,
    diskSizeMB: b.diskSizeMB,
    envdVersion: b.envdVersion,
  };
}
