import type { Queryable } from "./db.js";
import { type BuildRecord, toBuild } from "./templates.js";

/** A template's tags: names of its builds (E2B's `name:tag`; `default` when none is given). */

export const DEFAULT_TAG = "default";

export async function assignTags(
  db: Queryable,
  templateId: string,
  buildId: string,
  tags: readonly string[],
): Promise<void> {
  for (const tag of tags) {
    await db.query("INSERT INTO template_tags (template_id, tag, build_id) VALUES ($1, $2, $3)", [
      templateId,
      tag,
      buildId,
    ]);
  }
}

export async function removeTags(db: Queryable, templateId: string, tags: readonly string[]): Promise<number> {
  const result = await db.query("DELETE FROM template_tags WHERE template_id = $1 AND tag = ANY($2)", [
    templateId,
    tags,
  ]);
  return result.rowCount ?? 0;
}

/** The build `tag` names: its newest assignment whose build is ready (a build id works as a tag too). */
export async function resolveTag(db: Queryable, templateId: string, tag: string): Promise<BuildRecord | undefined> {
  const result = await db.query(
    `SELECT b.* FROM template_builds b
     WHERE b.template_id = $1 AND b.status = 'ready' AND (
       b.id::text = $2 OR b.id IN (SELECT build_id FROM template_tags WHERE template_id = $1 AND tag = $2))
     ORDER BY (SELECT max(t.id) FROM template_tags t WHERE t.template_id = $1 AND t.tag = $2 AND t.build_id = b.id)
       DESC NULLS LAST, b.created_at DESC
     LIMIT 1`,
    [templateId, tag],
  );
  return result.rows[0] ? toBuild(result.rows[0]) : undefined;
}

/** Whether a build `tag` names is still waiting or building (a create for it may wait for it). */
export async function hasPendingBuild(db: Queryable, templateId: string, tag: string): Promise<boolean> {
  const result = await db.query(
    `SELECT 1 FROM template_builds b WHERE b.template_id = $1 AND b.status IN ('waiting', 'building')
       AND b.spec IS NOT NULL AND b.id IN (SELECT build_id FROM template_tags WHERE template_id = $1 AND tag = $2)`,
    [templateId, tag],
  );
  return (result.rowCount ?? 0) > 0;
}

/** Per tag, its newest assignment (whatever its build's status), ordered by tag. */
export async function listTags(
  db: Queryable,
  templateId: string,
): Promise<{ tag: string; buildId: string; createdAt: Date }[]> {
  const result = await db.query(
    `SELECT DISTINCT ON (tag) tag, build_id, created_at FROM template_tags WHERE template_id = $1
     ORDER BY tag, id DESC`,
    [templateId],
  );
  return result.rows.map((r) => ({ tag: r.tag, buildId: r.build_id, createdAt: r.created_at }));
}

/** Tags whose newest assignment is `buildId`. */
export async function tagsOfBuild(db: Queryable, templateId: string, buildId: string): Promise<string[]> {
  return (await listTags(db, templateId)).filter((t) => t.buildId === buildId).map((t) => t.tag);
}
