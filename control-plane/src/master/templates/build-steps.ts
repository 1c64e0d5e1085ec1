import { createHash } from "node:crypto";
import { posix } from "node:path";
import type { TemplateStep } from "../../store/template-spec.js";
import type { BuildContext } from "../../store/templates.js";

/**
 * E2B's template steps as the builder runs them (shared/E2B-TEMPLATES.md §3.2–3.3, §5): what each step type
 * means, the shell it becomes inside the build sandbox, and the cache key chain. Pure: no I/O here.
 */

export class StepError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StepError";
  }
}

/** E2B's `HashKeys(base, k1, k2, …)`: hex SHA-256 of base, then `;` + k for each. */
export function hashKeys(base: string, ...keys: readonly string[]): string {
  const hash = createHash("sha256").update(base);
  for (const key of keys) hash.update(`;${key}`);
  return hash.digest("hex");
}

/** The key of a step's layer: the previous layer's key, the step, and its files. */
export function stepKey(previous: string, step: TemplateStep): string {
  return hashKeys(previous, step.type, step.args.join(" "), step.filesHash ?? "<nil>");
}

/** POSIX single quotes, as the SDK's `q()` (shlex.quote). */
export function shellQuote(value: string): string {
  if (value === "") return "''";
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(value)) return value;
  return `'${value.replaceAll("'", `'"'"'`)}'`;
}

/** Whether a step writes the filesystem (and so needs a layer of its own); ENV changes only the context. */
export function changesFiles(step: TemplateStep): boolean {
  return step.type !== "ENV";
}

/** The environment a step's commands run with: the context's, with the standard PATH appended when it sets PATH. */
export function commandEnv(context: BuildContext): Record<string, string> {
  const env = { ...context.env };
  if (env.PATH !== undefined) env.PATH = `${env.PATH}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`;
  return env;
}

/** ENV `[k1, v1, …]` as pairs; an odd count or none is the step's error. */
export function envPairs(step: TemplateStep): [string, string][] {
  if (step.args.length === 0 || step.args.length % 2 !== 0) {
    throw new StepError(`ENV needs name and value pairs, got ${step.args.length} argument(s)`);
  }
  const pairs: [string, string][] = [];
  for (let i = 0; i < step.args.length; i += 2) {
    const name = step.args[i] ?? "";
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new StepError(`ENV: invalid variable name '${name}'`);
    pairs.push([name, step.args[i + 1] ?? ""]);
  }
  return pairs;
}

/**
 * The command that expands an ENV value as E2B does: by the shell, so `$VAR`/`${VAR}` expand while command
 * substitution does not (backslash, double quote, backtick and `$(` are escaped).
 */
export function envExpansionCommand(value: string): string {
  const escaped = value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("`", "\\`").replaceAll("$(", "\\$(");
  return `printf '%s' "${escaped}"`;
}

/** WORKDIR: the directory made absolute against the current workdir (or `/`). */
export function workdirTarget(context: BuildContext, path: string): string {
  if (path.trim() === "") throw new StepError("WORKDIR needs a path");
  return posix.resolve(context.workdir ?? "/", path);
}

/**
 * Creates the workdir when missing (the topmost new directory is given to the context user, recursively) and
 * prints its canonical path.
 */
export function workdirCommand(target: string, user: string): string {
  const p = shellQuote(target);
  const u = shellQuote(user);
  return `set -e
p=${p}
if [ ! -d "$p" ]; then
  top="$p"
  while [ ! -d "$(dirname "$top")" ]; do top="$(dirname "$top")"; done
  mkdir -p "$p"
  chown -R ${u}:"$(id -gn ${u})" "$top"
fi
cd "$p" && pwd -P`;
}

/** USER: creates the account when missing (home, bash), as E2B does. */
export function userCommand(name: string): string {
  if (!/^[a-z_][a-z0-9_-]{0,31}$/.test(name)) throw new StepError(`USER: invalid user name '${name}'`);
  return `id -u ${name} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash ${name}`;
}

/** Where a COPY source sits inside the uploaded archive: `src` cut before its first glob metacharacter's folder. */
export function archiveSource(src: string): string {
  const glob = src.search(/[*?[{]/);
  if (glob < 0) return src.replace(/\/+$/, "") || ".";
  const slash = src.lastIndexOf("/", glob);
  return slash < 0 ? "." : src.slice(0, slash) || ".";
}

export interface CopyPlan {
  readonly archivePath: string;
  readonly command: string;
}

/**
 * COPY `[src, dest, owner, mode]`: the archive (uploaded by the SDK, sent into the sandbox at `archivePath`) is
 * extracted into a scratch folder, the source's owner and mode set, then a file or link moves to `dest` (inside it
 * when `dest` ends with `/`) and a folder's contents merge into `dest`, Docker's way. Runs as root.
 */
export function copyPlan(step: TemplateStep, context: BuildContext, scratchId: string): CopyPlan {
  const [src = "", dest = "", owner = "", mode = ""] = step.args;
  if (!step.filesHash) throw new StepError("COPY has no filesHash (the SDK sends one per COPY step)");
  if (src === "" || dest === "") throw new StepError("COPY needs a source and a destination");
  if (posix.isAbsolute(src) || posix.normalize(src).split("/")[0] === "..") {
    throw new StepError(`COPY source '${src}' is outside the build context`);
  }
  if (mode !== "" && !/^0?[0-7]{3,4}$/.test(mode)) throw new StepError(`COPY: invalid mode '${mode}'`);
  const ownerSpec = owner === "" ? context.user : owner;
  const [ownerUser = "", ownerGroup] = ownerSpec.split(":");
  if (!/^[a-z_][a-z0-9_-]*$/.test(ownerUser) || (ownerGroup !== undefined && !/^[a-z_][a-z0-9_-]*$/.test(ownerGroup))) {
    throw new StepError(`COPY: invalid owner '${ownerSpec}'`);
  }
  const archivePath = `/tmp/.warren-copy-${scratchId}`;
  const inArchive = archiveSource(src);
  const chownTo = ownerGroup ? `${ownerUser}:${ownerGroup}` : `${ownerUser}:"$(id -gn ${ownerUser})"`;
  const destExpr = posix.isAbsolute(dest)
    ? shellQuote(dest)
    : context.workdir
      ? shellQuote(posix.join(context.workdir, dest))
      : `"$(getent passwd ${shellQuote(context.user)} | cut -d: -f6)"/${shellQuote(dest)}`;
  const intoDir = dest.endsWith("/");
  const command = `set -e
a=${archivePath}
s="$(mktemp -d /tmp/.warren-copy-XXXXXX)"
trap 'rm -rf "$s" "$a"' EXIT
tar -xf "$a" -C "$s" --no-same-owner
src="$s"/${shellQuote(inArchive)}
if [ ! -e "$src" ] && [ ! -L "$src" ]; then echo "source path does not exist: ${inArchive.replaceAll('"', "")}" >&2; exit 1; fi
dest=${destExpr}
if [ -d "$src" ] && [ ! -L "$src" ]; then
  chown -R ${chownTo} "$src"
  ${mode ? `chmod -R ${mode} "$src"` : ":"}
  mkdir -p "$dest"
  cp -a "$src"/. "$dest"/
else
  chown -h ${chownTo} "$src"
  ${mode ? `[ -L "$src" ] || chmod ${mode} "$src"` : ":"}
  ${intoDir ? `mkdir -p "$dest" && mv -f "$src" "$dest"/` : `mkdir -p "$(dirname "$dest")" && mv -f "$src" "$dest"`}
fi`;
  return { archivePath, command };
}

/** The step as E2B's log shows it: `RUN echo hi`. */
export function describeStep(step: TemplateStep): string {
  return `${step.type} ${step.args.filter((a) => a !== "").join(" ")}`.trim();
}
