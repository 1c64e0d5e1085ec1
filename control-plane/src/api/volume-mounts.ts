import type { Queryable } from "../store/db.js";
import { volumesByName } from "../store/volumes.js";
import { badRequest } from "./errors.js";

/** A create's `volumeMounts` entry as E2B's SDK sends it: a team volume's name and where it appears. */
export interface RequestedMount {
  readonly name: string;
  readonly path: string;
}

/** What the sandbox row keeps (the api echoes `name` and `path`; the nodes bind `volumeId`). */
export interface ResolvedMount extends RequestedMount {
  readonly volumeId: string;
}

/** Paths Warren itself mounts or needs: a volume over them would hide envd or the sandbox's system view. */
const RESERVED = ["/", "/proc", "/dev", "/sys", "/opt/warren", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64"];

function pathProblem(path: string, earlier: readonly string[]): string | undefined {
  if (path === "") return "path cannot be empty";
  if (!path.startsWith("/")) return "path must be absolute";
  const parts = path.split("/").slice(1);
  if (parts.some((p) => p === "." || p === "..") || parts.some((p, i) => p === "" && i < parts.length)) {
    return "path must not contain any '.' or '..' components";
  }
  if (path.includes("\0") || Buffer.byteLength(path) > 1024) return "path must be at most 1024 bytes, without NUL";
  if (RESERVED.some((r) => path === r || (r !== "/" && r !== "/etc" && r !== "/usr" && path.startsWith(`${r}/`)))) {
    return `path '${path}' is reserved by the sandbox`;
  }
  if (earlier.includes(path)) return `path '${path}' is already used`;
  return undefined;
}

/** E2B's `invalid mounts:\n\t- volume mount #i: <reason>` for every bad entry at once. */
function invalid(reasons: readonly string[]): Error {
  return badRequest(`invalid mounts:\n${reasons.map((r) => `\t- ${r}`).join("\n")}`);
}

/**
 * Checks the names and paths of `volumeMounts` (their shape and number are the document's), every entry at once in
 * E2B's words; names are resolved per team by `resolveVolumeMounts`.
 */
export function parseVolumeMounts(requested: readonly RequestedMount[]): RequestedMount[] {
  const reasons: string[] = [];
  const mounts: RequestedMount[] = [];
  requested.forEach(({ name, path }, i) => {
    if (name === "") reasons.push(`volume mount #${i}: volume name cannot be empty`);
    const problem = pathProblem(
      path,
      mounts.map((m) => m.path),
    );
    if (problem) reasons.push(`volume mount #${i}: ${problem}`);
    mounts.push({ name, path });
  });
  if (reasons.length > 0) throw invalid(reasons);
  return mounts;
}

/** Resolves the names to the team's volumes; another team's volume is not found, as an unknown one. */
export async function resolveVolumeMounts(
  db: Queryable,
  teamId: string,
  mounts: readonly RequestedMount[],
): Promise<ResolvedMount[]> {
  if (mounts.length === 0) return [];
  const volumes = await volumesByName(
    db,
    teamId,
    mounts.map((m) => m.name),
  );
  const reasons: string[] = [];
  const resolved = mounts.flatMap((m, i) => {
    const volume = volumes.get(m.name);
    if (!volume) {
      reasons.push(`volume mount #${i}: volume '${m.name}' not found`);
      return [];
    }
    return [{ name: m.name, path: m.path, volumeId: volume.id }];
  });
  if (reasons.length > 0) throw invalid(reasons);
  return resolved;
}
