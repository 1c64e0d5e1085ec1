import type { CliConfig } from "./config.js";
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

export async function createKey(
  config: CliConfig,
  teamId: string,
  name: string | undefined,
  out: Output,
  approver = false,
) {
  const key = await admin<{ id: string; key: string; prefix: string }>(config, {
    method: "POST",
    path: `/warren/v1/admin/teams/${encodeURIComponent(teamId)}/api-keys`,
    body: { ...(name ? { name } : {}), ...(approver ? { approver: true } : {}) },
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
