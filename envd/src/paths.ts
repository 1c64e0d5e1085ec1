import { isAbsolute, join, resolve } from "node:path";
import { invalidArgument } from "./errors.js";
import type { SandboxUser } from "./users.js";

/**
 * Resolves a client path as E2B's envd does: `~` and `~/x` expand to the user's home,
 * relative paths are taken from `base` (the user's home unless a caller passes another),
 * and the result is absolute and normalised. Symlinks are not resolved here.
 */
export function resolveUserPath(path: string, user: SandboxUser, base: string = user.home): string {
  if (path.includes("\0")) throw invalidArgument("path must not contain NUL bytes");
  if (path === "~") return resolve(user.home);
  if (path.startsWith("~/")) return resolve(join(user.home, path.slice(2)));
  if (isAbsolute(path)) return resolve(path);
  return resolve(base, path);
}
