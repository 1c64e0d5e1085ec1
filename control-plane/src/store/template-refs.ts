import type { Queryable } from "./db.js";
import { DEFAULT_TAG, resolveTag } from "./template-tags.js";
import {
  type BuildRecord,
  getTemplate,
  ownOrShippedByAlias,
  type TemplateRecord,
  templateByAlias,
} from "./templates.js";

/** A template name as E2B parses it (`ParseName`): `alias`, `alias:tag`, `namespace/alias:tag`. */
export interface TemplateName {
  readonly namespace?: string;
  readonly alias: string;
  /** Absent for no tag or `default`. */
  readonly tag?: string;
}

const NAME_PART = /^[a-z0-9_-]+$/;
const TAG = /^[a-z0-9_.-]+$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export class TemplateNameError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TemplateNameError";
  }
}

/**
 * E2B's rules: trim; split at the first `:` into identifier and tag, the identifier at the first `/` into
 * namespace and alias; each part lowercased; alias and namespace `[a-z0-9_-]+`, tag `[a-z0-9_.-]+`; a tag
 * `default` counts as none. Throws TemplateNameError naming what is wrong.
 */
export function parseTemplateName(raw: string): TemplateName {
  const name = raw.trim();
  if (name === "") throw new TemplateNameError("Name is required");
  if (name.length > 256)
    throw new TemplateNameError(`Invalid name: '${name.slice(0, 40)}…' is longer than 256 characters`);
  const colon = name.indexOf(":");
  const identifier = colon >= 0 ? name.slice(0, colon) : name;
  const rawTag =
    colon >= 0
      ? name
          .slice(colon + 1)
          .trim()
          .toLowerCase()
      : undefined;
  const slash = identifier.indexOf("/");
  const namespace = slash >= 0 ? identifier.slice(0, slash).trim().toLowerCase() : undefined;
  const alias = (slash >= 0 ? identifier.slice(slash + 1) : identifier).trim().toLowerCase();
  if (!NAME_PART.test(alias)) {
    throw new TemplateNameError(`Invalid name: '${alias}' (template names are lowercase letters, digits, '-' and '_')`);
  }
  if (namespace !== undefined && !NAME_PART.test(namespace)) {
    throw new TemplateNameError(`Invalid name: namespace '${namespace}' (lowercase letters, digits, '-' and '_')`);
  }
  // A build id works where a tag is expected (E2B); only tags being assigned may not look like one.
  if (rawTag !== undefined && !UUID.test(rawTag)) parseTag(rawTag);
  const tag = rawTag === undefined || rawTag === DEFAULT_TAG ? undefined : rawTag;
  return { ...(namespace !== undefined ? { namespace } : {}), alias, ...(tag !== undefined ? { tag } : {}) };
}

/** A tag as E2B validates one in `tags[]`: lowercased, `[a-z0-9_.-]+`, not a UUID. */
export function parseTag(raw: string): string {
  const tag = raw.trim().toLowerCase();
  if (!TAG.test(tag))
    throw new TemplateNameError(`Invalid tag: '${raw}' (lowercase letters, digits, '-', '_' and '.')`);
  if (UUID.test(tag)) throw new TemplateNameError(`Invalid tag: '${raw}' must not be a UUID`);
  return tag;
}

export interface TemplateOwner {
  readonly id: string;
  /** The team's namespace (slug of its name). */
  readonly namespace: string;
}

export interface ResolvedTemplate {
  readonly template: TemplateRecord;
  /** Whether the caller owns it (else it is public, or shipped). */
  readonly owned: boolean;
  readonly tag: string;
}

/**
 * Finds the template a name or id names, for `team`: an explicit namespace must be the team's; a bare alias is
 * looked up in the team's namespace, then among Warren's shipped templates, then as a template id (the caller's,
 * or a public one). Another team's private template is not found. `undefined` for a name that matches nothing.
 */
export async function findTemplateByRef(
  db: Queryable,
  team: TemplateOwner,
  ref: string,
): Promise<ResolvedTemplate | undefined> {
  let name: TemplateName;
  try {
    name = parseTemplateName(ref);
  } catch {
    return undefined;
  }
  const tag = name.tag ?? DEFAULT_TAG;
  if (name.namespace !== undefined) {
    if (name.namespace !== team.namespace) return undefined;
    const own = await templateByAlias(db, team.id, name.alias);
    return own ? { template: own, owned: true, tag } : undefined;
  }
  const found = await ownOrShippedByAlias(db, team.id, name.alias);
  if (found) return { template: found, owned: found.teamId !== null, tag };
  const byId = await getTemplate(db, name.alias);
  if (byId && (byId.teamId === team.id || byId.public)) return { template: byId, owned: byId.teamId === team.id, tag };
  return undefined;
}

/** The ready build a resolved team template's tag names, or undefined (no ready build under that tag). */
export async function readyBuildOf(db: Queryable, resolved: ResolvedTemplate): Promise<BuildRecord | undefined> {
  return resolveTag(db, resolved.template.id, resolved.tag);
}
