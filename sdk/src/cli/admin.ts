import { existsSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { ApiClient } from "../api.js";
import type { ConnectionOpts } from "../config.js";
import { type CliConfig, WARREN_HOME } from "./config.js";
import { CliError, ExitCode } from "./errors.js";
import { type Output, table } from "./output.js";

interface AdminCall {
  method: "GET" | "POST" | "DELETE";
  path: string;
  body?: unknown;
  /** What to do when the api answers 404 (it names what was not found). */
  notFoundHint?: string;
}

/**
 * Calls an admin endpoint (`X-Admin-Token`) and returns the parsed body (undefined for 204); errors
 * become CliErrors that say which token to use.
 */
async function admin<T>(config: CliConfig, call: AdminCall): Promise<T> {
  if (!config.apiUrl) {
    throw new CliError("no api URL", "pass --api-url, set WARREN_API_URL, or run `warren up`", ExitCode.usage);
  }
  if (!config.adminToken) {
    throw new CliError(
      "admin commands need the admin token",
      "pass --admin-token or set WARREN_ADMIN_TOKEN (`warren up` writes it to .warren/env)",
      ExitCode.auth,
    );
  }
  const res = await fetch(`${config.apiUrl}${call.path}`, {
    method: call.method,
    headers: { "X-Admin-Token": config.adminToken, "Content-Type": "application/json" },
    ...(call.body !== undefined ? { body: JSON.stringify(call.body) } : {}),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  if (res.ok) return (text === "" ? undefined : JSON.parse(text)) as T;
  let message = text;
  try {
    message = (JSON.parse(text) as { message?: string }).message ?? text;
  } catch {
    // not JSON: the raw body is the message
  }
  if (res.status === 401) {
    throw new CliError(
      `the api refused the admin token: ${message}`,
      "use WARREN_ADMIN_TOKEN from .warren/env",
      ExitCode.auth,
    );
  }
  if (res.status === 404) throw new CliError(message, call.notFoundHint, ExitCode.notFound);
  throw new CliError(`${res.status}: ${message}`);
}

const NO_TEAM_HINT = "`warren team create NAME` makes a team";

export async function createTeam(config: CliConfig, name: string, out: Output): Promise<number> {
  const created = await admin<{ team: { id: string; name: string }; apiKey: { id: string; key: string } }>(config, {
    method: "POST",
    path: "/warren/v1/admin/teams",
    body: { name },
    notFoundHint: NO_TEAM_HINT,
  });
  out.result(created, () => [
    `team    ${created.team.id} (${created.team.name})`,
    `api key ${created.apiKey.key}`,
    "(the key is shown once: keep it; export WARREN_API_KEY=<key> to use it)",
  ]);
  return ExitCode.ok;
}

export async function createKey(config: CliConfig, teamId: string, name: string | undefined, out: Output) {
  const key = await admin<{ id: string; key: string; prefix: string }>(config, {
    method: "POST",
    path: `/warren/v1/admin/teams/${encodeURIComponent(teamId)}/api-keys`,
    body: name ? { name } : {},
    notFoundHint: NO_TEAM_HINT,
  });
  out.result({ teamId, ...key }, () => key.key);
  return ExitCode.ok;
}

interface NodeView {
  id: string;
  addr: string;
  state: string;
  lastSeenAt: string | null;
  cordonedAt: string | null;
}

/** The nodes as the master last saw them, with their cordons. */
export async function listNodes(config: CliConfig, out: Output): Promise<number> {
  const nodes = (await admin<NodeView[]>(config, { method: "GET", path: "/warren/v1/admin/nodes" })) ?? [];
  out.result(nodes, () =>
    nodes.length === 0
      ? "no nodes"
      : table([
          ["NODE", "ADDRESS", "STATE", "CORDONED", "LAST SEEN"],
          ...nodes.map((n) => [n.id, n.addr, n.state, n.cordonedAt ?? "no", n.lastSeenAt ?? "never"]),
        ]),
  );
  return ExitCode.ok;
}

/** Cordons a node (no new sandboxes there; paused ones resume elsewhere) or lifts its cordon. */
export async function cordonNode(config: CliConfig, nodeId: string, cordoned: boolean, out: Output) {
  await admin<undefined>(config, {
    method: cordoned ? "POST" : "DELETE",
    path: `/warren/v1/admin/nodes/${encodeURIComponent(nodeId)}/cordon`,
    notFoundHint: "`warren node list` shows the nodes",
  });
  out.result({ nodeId, cordoned }, () => `${cordoned ? "cordoned" : "uncordoned"} node ${nodeId}`);
  return ExitCode.ok;
}

interface TemplateView {
  templateId: string;
  aliases: string[];
  cpuCount: number;
  memoryMB: number;
  source: "api" | "node catalog";
}

interface Recipe {
  id: string;
  parent?: string;
  defaults: { cpuCount: number; memoryMiB: number };
}

/** The templates node agents of this checkout build (control-plane's catalog), when the api cannot list them. */
async function catalogTemplates(): Promise<TemplateView[]> {
  const catalog = join(WARREN_HOME, "control-plane", "dist", "templates", "catalog.js");
  if (!existsSync(catalog)) throw new CliError("the api does not list templates, and no Warren checkout is at hand");
  const { TEMPLATE_RECIPES } = (await import(pathToFileURL(catalog).href)) as {
    TEMPLATE_RECIPES: Record<string, Recipe>;
  };
  return Object.values(TEMPLATE_RECIPES).map((r) => ({
    templateId: r.id,
    aliases: [r.id],
    cpuCount: r.defaults.cpuCount,
    memoryMB: r.defaults.memoryMiB,
    source: "node catalog",
  }));
}

/** E2B's `GET /templates`; Warren's api does not serve it yet, so the nodes' catalog answers instead. */
export async function listTemplates(conn: ConnectionOpts, out: Output): Promise<number> {
  const res = await new ApiClient(conn).request<Record<string, unknown>[]>({
    method: "GET",
    path: "/templates",
    expect: [404, 501],
  });
  let templates: TemplateView[];
  if (res.status === 404 || res.status === 501) {
    out.note("warren: the api has no template listing yet; these are the templates the node agents build");
    templates = await catalogTemplates();
  } else {
    templates = (res.body ?? []).map((t) => ({
      templateId: String(t.templateID ?? t.templateId ?? ""),
      aliases: Array.isArray(t.aliases) ? t.aliases.map(String) : [],
      cpuCount: Number(t.cpuCount ?? 0),
      memoryMB: Number(t.memoryMB ?? 0),
      source: "api",
    }));
  }
  out.result(templates, () =>
    table([
      ["TEMPLATE", "ALIASES", "CPUS", "MEMORY MB"],
      ...templates.map((t) => [t.templateId, t.aliases.join(","), String(t.cpuCount), String(t.memoryMB)]),
    ]),
  );
  return ExitCode.ok;
}

export function buildTemplate(): never {
  throw new CliError(
    "template builds are not available from the CLI yet: each node agent builds the templates of its catalog itself " +
      "(at start, or on first use), from control-plane/src/templates/catalog.ts",
    "to add a template, add a recipe to that catalog and restart the node agents (`warren down && warren up --detach`)",
  );
}
