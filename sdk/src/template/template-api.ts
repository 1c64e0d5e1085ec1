import { type ApiClient, bodyCode } from "../api.js";
import { TemplateError } from "../errors.js";
import { callApi } from "./build-api.js";
import type { TemplateBuildStatus, TemplateTag, TemplateTagInfo } from "./types.js";

/**
 * The template REST calls besides a build: name lookup, tags (E2B-TEMPLATES.md §2 rows 6–9) and Warren's
 * listing, detail and delete (§2.2 and row 10), which E2B's SDK leaves to its CLI.
 */

const path = (...parts: string[]) => `/${parts.map(encodeURIComponent).join("/")}`;

/** `GET /templates/aliases/{name}`: 404 → false; 403 (another team's) → true; 200 → true when a body came. */
export async function checkAliasExists(client: ApiClient, alias: string, signal?: AbortSignal): Promise<boolean> {
  const res = await callApi<unknown>(
    client,
    { method: "GET", path: `/templates/aliases/${encodeURIComponent(alias)}`, expect: [403, 404], signal },
    TemplateError,
  );
  if (res.status === 404) return false;
  if (res.status === 403) return true;
  return res.body !== undefined;
}

/** `POST /templates/tags`: points `tags` at the build `target` (`name:tag`) resolves to. */
export async function assignTags(
  client: ApiClient,
  target: string,
  tags: string[],
  signal?: AbortSignal,
): Promise<TemplateTagInfo> {
  const res = await callApi<Record<string, unknown>>(
    client,
    { method: "POST", path: "/templates/tags", body: { target, tags }, signal },
    TemplateError,
  );
  if (!res.body) throw new TemplateError("Failed to assign tags");
  return { buildId: String(res.body.buildID), tags: Array.isArray(res.body.tags) ? res.body.tags.map(String) : [] };
}

/** `DELETE /templates/tags` with `{name, tags}`. */
export async function removeTags(client: ApiClient, name: string, tags: string[], signal?: AbortSignal) {
  await callApi(client, { method: "DELETE", path: "/templates/tags", body: { name, tags }, signal }, TemplateError);
}

/** `GET /templates/{idOrName}/tags`: each tag's latest assignment. */
export async function getTemplateTags(client: ApiClient, idOrName: string, signal?: AbortSignal) {
  const res = await callApi<unknown>(
    client,
    { method: "GET", path: path("templates", idOrName, "tags"), signal },
    TemplateError,
  );
  if (!Array.isArray(res.body)) throw new TemplateError("Failed to get template tags");
  return res.body.map(
    (item: Record<string, unknown>): TemplateTag => ({
      tag: String(item.tag),
      buildId: String(item.buildID),
      createdAt: new Date(String(item.createdAt)),
    }),
  );
}

/** A template as listed (Warren extra; E2B's `Template` schema with SDK-style names). */
export interface TemplateInfo {
  templateId: string;
  /** Latest ready build of the `default` tag (the zero UUID when none). */
  buildId: string;
  buildStatus: TemplateBuildStatus | string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  envdVersion: string;
  public: boolean;
  /** `<namespace>/<alias>` names. */
  names: string[];
  aliases: string[];
  createdAt: Date;
  updatedAt: Date;
  lastSpawnedAt: Date | null;
  spawnCount: number;
  buildCount: number;
}

export interface TemplateBuildSummary {
  buildId: string;
  status: TemplateBuildStatus | string;
  createdAt: Date;
  updatedAt: Date;
  finishedAt?: Date;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB?: number;
  envdVersion?: string;
}

/** A template with its builds, newest first (Warren extra; E2B's `TemplateWithBuilds`). */
export interface TemplateDetail extends TemplateInfo {
  builds: TemplateBuildSummary[];
}

const num = (v: unknown) => (typeof v === "number" ? v : Number(v ?? 0));
const date = (v: unknown) => new Date(String(v));
const strings = (v: unknown) => (Array.isArray(v) ? v.map(String) : []);

function templateInfoFrom(t: Record<string, unknown>): TemplateInfo {
  return {
    templateId: String(t.templateID ?? ""),
    buildId: String(t.buildID ?? ""),
    buildStatus: String(t.buildStatus ?? ""),
    cpuCount: num(t.cpuCount),
    memoryMB: num(t.memoryMB),
    diskSizeMB: num(t.diskSizeMB),
    envdVersion: String(t.envdVersion ?? ""),
    public: t.public === true,
    names: strings(t.names),
    aliases: strings(t.aliases),
    createdAt: date(t.createdAt),
    updatedAt: date(t.updatedAt),
    lastSpawnedAt: t.lastSpawnedAt ? date(t.lastSpawnedAt) : null,
    spawnCount: num(t.spawnCount),
    buildCount: num(t.buildCount),
  };
}

function buildSummaryFrom(b: Record<string, unknown>): TemplateBuildSummary {
  const out: TemplateBuildSummary = {
    buildId: String(b.buildID ?? ""),
    status: String(b.status ?? ""),
    createdAt: date(b.createdAt),
    updatedAt: date(b.updatedAt),
    cpuCount: num(b.cpuCount),
    memoryMB: num(b.memoryMB),
  };
  if (b.finishedAt) out.finishedAt = date(b.finishedAt);
  if (typeof b.diskSizeMB === "number") out.diskSizeMB = b.diskSizeMB;
  if (typeof b.envdVersion === "string") out.envdVersion = b.envdVersion;
  return out;
}

/** `GET /templates`: the team's templates, oldest first. */
export async function listTemplates(client: ApiClient, signal?: AbortSignal): Promise<TemplateInfo[]> {
  const res = await callApi<unknown>(client, { method: "GET", path: "/templates", signal }, TemplateError);
  if (!Array.isArray(res.body)) throw new TemplateError("Failed to list templates");
  return res.body.map(templateInfoFrom);
}

/** `GET /templates/{idOrName}`: one template with its builds. */
export async function getTemplate(client: ApiClient, idOrName: string, signal?: AbortSignal): Promise<TemplateDetail> {
  const res = await callApi<Record<string, unknown>>(
    client,
    { method: "GET", path: path("templates", idOrName), signal },
    TemplateError,
  );
  if (!res.body || typeof res.body !== "object") throw new TemplateError(`Failed to get template ${idOrName}`);
  const builds = Array.isArray(res.body.builds) ? res.body.builds : [];
  return { ...templateInfoFrom(res.body), builds: builds.map(buildSummaryFrom) };
}

/** `DELETE /templates/{idOrName}`: false when there is no such template. */
export async function deleteTemplate(client: ApiClient, idOrName: string, signal?: AbortSignal): Promise<boolean> {
  const res = await callApi(
    client,
    { method: "DELETE", path: path("templates", idOrName), expect: [404], signal },
    TemplateError,
  );
  return !(res.status === 404 || bodyCode(res.body) === 404);
}
