import { existsSync, readFileSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { ApiClient } from "../api.js";
import type { ConnectionOpts } from "../config.js";
import { waitForBuildFinish } from "../template/build-api.js";
import { BuildError, TemplateError } from "../template/errors.js";
import type { LogEntry } from "../template/logs.js";
import { waitForTimeout } from "../template/ready-cmd.js";
import { TemplateBase } from "../template/template.js";
import type { TemplateDetail, TemplateInfo } from "../template/template-api.js";
import { templateFromJSON } from "../template/template-file.js";
import type { BuildInfo, TemplateBuildStatusResponse } from "../template/types.js";
import { CliError, ExitCode } from "./errors.js";
import { type Output, table } from "./output.js";
import { humanBytes } from "./snapshot.js";

/** `warren template ...`: build templates from a Dockerfile or a template file, list, inspect, tag and delete them. */

export interface BuildFlags {
  file?: string;
  templateFile?: string;
  context?: string;
  tag?: string[];
  cpu?: number;
  memoryMb?: number;
  startCmd?: string;
  readyCmd?: string;
  /** commander's `--no-cache`: false when given. */
  cache?: boolean;
}

const LIST_HINT = "`warren template list` shows the templates your key can see";

/** A 404 from a template call is "not found" (exit 6) with a hint; other errors go to the CLI's mapping. */
function notFound(error: unknown): unknown {
  if (error instanceof TemplateError && error.statusCode === 404) {
    return new CliError(error.message, LIST_HINT, ExitCode.notFound);
  }
  return error;
}

/** The definition to build: `--template-file`, `-f`, or `e2b.Dockerfile`/`Dockerfile` in the context dir. */
export function templateToBuild(
  flags: BuildFlags,
  warn: (message: string) => void,
  cwd = process.cwd(),
): { template: TemplateBase; source: string } {
  const context = resolve(cwd, flags.context ?? ".");
  if (!existsSync(context) || !statSync(context).isDirectory()) {
    throw new CliError(`context directory ${context} does not exist`, "pass --context <dir>", ExitCode.usage);
  }
  if (flags.file && flags.templateFile) {
    throw new CliError("-f and --template-file exclude each other", "build from one of them", ExitCode.usage);
  }
  const options = { fileContextPath: context };
  if (flags.templateFile) {
    const path = resolve(cwd, flags.templateFile);
    if (!existsSync(path)) throw new CliError(`no template file ${path}`, undefined, ExitCode.usage);
    return { template: templateFromJSON(readFileSync(path, "utf8"), options), source: path };
  }
  const dockerfile =
    flags.file !== undefined
      ? resolve(cwd, flags.file)
      : [resolve(context, "e2b.Dockerfile"), resolve(context, "Dockerfile")].find((p) => existsSync(p));
  if (dockerfile === undefined || !existsSync(dockerfile)) {
    throw new CliError(
      flags.file ? `no Dockerfile ${dockerfile}` : `no e2b.Dockerfile or Dockerfile in ${context}`,
      "pass -f <Dockerfile> or --template-file <file.json>",
      ExitCode.usage,
    );
  }
  const template = new TemplateBase(options);
  template.fromDockerfileWithWarnings(readFileSync(dockerfile, "utf8"), (w) => warn(`${w} (skipped)`));
  return { template, source: dockerfile };
}

function applyStartFlags(template: TemplateBase, flags: BuildFlags): void {
  if (flags.startCmd !== undefined) {
    const ready = flags.readyCmd ?? template.serialize([]).readyCmd ?? waitForTimeout(20_000);
    template.setStartCmd(flags.startCmd, ready);
  } else if (flags.readyCmd !== undefined) {
    template.setReadyCmd(flags.readyCmd);
  }
}

/** A build's progress for people: the phase on the spinner, the log lines above it. */
class BuildProgress {
  private phase = "queued";
  private readonly startedAt = Date.now();

  constructor(
    private readonly out: Output,
    private readonly spinner: ReturnType<Output["spinner"]>,
    private readonly name: string,
    private readonly steps: number,
  ) {}

  log(entry: LogEntry): void {
    if (entry.step) this.phase = this.phaseOf(entry.step);
    if (this.out.json || entry.level === "debug") return;
    const line = entry.level === "info" ? entry.message : `${entry.level.toUpperCase()} ${entry.message}`;
    process.stderr.write(`${process.stderr.isTTY ? "\r\x1b[2K" : ""}  ${line}\n`);
    this.update();
  }

  status(status: TemplateBuildStatusResponse): void {
    if (status.status === "waiting") this.phase = "waiting for a builder";
    this.update();
  }

  update(): void {
    const seconds = Math.round((Date.now() - this.startedAt) / 1000);
    this.spinner.update(`building ${this.name}: ${this.phase} (${seconds}s)`);
  }

  private phaseOf(step: string): string {
    if (step === "base") return "base layer";
    if (step === "finalize") return "finalizing (start and ready commands)";
    if (step === "optimize") return "optimizing";
    return /^\d+$/.test(step) ? `step ${step}/${this.steps}` : step;
  }
}

/** `warren template build`: uploads the context files, starts the build and follows it to the end. */
export async function buildTemplate(conn: ConnectionOpts, name: string, flags: BuildFlags, out: Output) {
  const { template, source } = templateToBuild(flags, (w) => out.note(`warren: ${w}`));
  applyStartFlags(template, flags);
  const steps = template.steps().length;
  out.note(`warren: building ${name} from ${source} (context ${template.fileContextPath}, ${steps} steps)`);
  const spinner = out.spinner(`building ${name}: uploading files`);
  const progress = new BuildProgress(out, spinner, name, steps);
  let info: BuildInfo | undefined;
  try {
    info = await TemplateBase.buildInBackground(template, name, {
      ...conn,
      ...(flags.tag && flags.tag.length > 0 ? { tags: flags.tag } : {}),
      ...(flags.cpu !== undefined ? { cpuCount: flags.cpu } : {}),
      ...(flags.memoryMb !== undefined ? { memoryMB: flags.memoryMb } : {}),
      skipCache: flags.cache === false,
    });
    progress.update();
    await waitForBuildFinish(new ApiClient(conn), info.templateId, info.buildId, {
      onBuildLogs: (entry) => progress.log(entry),
      onStatus: (status) => progress.status(status),
    });
  } catch (error) {
    spinner.fail(`build of ${name} failed`);
    if (info && error instanceof BuildError) {
      out.result({ ...info, status: "error", reason: error.message }, () => "");
      throw new CliError(
        error.message,
        `the build log above says more; \`warren template info ${name}\` lists its builds`,
      );
    }
    throw error;
  }
  spinner.succeed(`built ${name}: template ${info.templateId}, build ${info.buildId}, tags ${info.tags.join(", ")}`);
  // The template id alone on stdout, so `TPL=$(warren template build NAME)` works.
  out.result({ ...info, status: "ready" }, () => info.templateId);
  return ExitCode.ok;
}

function infoView(t: TemplateInfo) {
  return {
    ...t,
    createdAt: t.createdAt.toISOString(),
    updatedAt: t.updatedAt.toISOString(),
    lastSpawnedAt: t.lastSpawnedAt?.toISOString() ?? null,
  };
}

function detailView(t: TemplateDetail) {
  return {
    ...infoView(t),
    builds: t.builds.map((b) => ({
      ...b,
      createdAt: b.createdAt.toISOString(),
      updatedAt: b.updatedAt.toISOString(),
      ...(b.finishedAt ? { finishedAt: b.finishedAt.toISOString() } : {}),
    })),
  };
}

const mib = (n: number) => humanBytes(n * 1024 * 1024);

export async function listTemplates(conn: ConnectionOpts, out: Output): Promise<number> {
  const templates = await TemplateBase.list(conn);
  out.result(templates.map(infoView), () =>
    templates.length === 0
      ? "no templates (`warren template build NAME` makes one)"
      : table([
          ["TEMPLATE ID", "NAMES", "STATUS", "CPUS", "MEMORY", "DISK", "BUILDS", "UPDATED"],
          ...templates.map((t) => [
            t.templateId,
            (t.names.length > 0 ? t.names : t.aliases).join(",") || "-",
            t.buildStatus || "-",
            String(t.cpuCount),
            mib(t.memoryMB),
            t.diskSizeMB ? mib(t.diskSizeMB) : "-",
            String(t.buildCount),
            t.updatedAt.toISOString(),
          ]),
        ]),
  );
  return ExitCode.ok;
}

export async function templateInfo(conn: ConnectionOpts, name: string, out: Output): Promise<number> {
  try {
    const [detail, tags] = await Promise.all([TemplateBase.getInfo(name, conn), TemplateBase.getTags(name, conn)]);
    const tagView = tags.map((t) => ({ ...t, createdAt: t.createdAt.toISOString() }));
    out.result({ ...detailView(detail), tags: tagView }, () => [
      `template  ${detail.templateId}`,
      `names     ${detail.names.join(", ") || "-"}`,
      `public    ${detail.public ? "yes" : "no"}`,
      `resources ${detail.cpuCount} CPUs, ${mib(detail.memoryMB)} memory, ${detail.diskSizeMB ? mib(detail.diskSizeMB) : "-"} disk`,
      `envd      ${detail.envdVersion || "-"}`,
      `spawned   ${detail.spawnCount} times${detail.lastSpawnedAt ? `, last ${detail.lastSpawnedAt.toISOString()}` : ""}`,
      "",
      ...table([["TAG", "BUILD", "ASSIGNED"], ...tags.map((t) => [t.tag, t.buildId, t.createdAt.toISOString()])]),
      "",
      ...table([
        ["BUILD", "STATUS", "CPUS", "MEMORY", "CREATED", "FINISHED"],
        ...detail.builds.map((b) => [
          b.buildId,
          b.status,
          String(b.cpuCount),
          mib(b.memoryMB),
          b.createdAt.toISOString(),
          b.finishedAt?.toISOString() ?? "-",
        ]),
      ]),
    ]);
    return ExitCode.ok;
  } catch (error) {
    throw notFound(error);
  }
}

export async function deleteTemplates(conn: ConnectionOpts, names: string[], out: Output): Promise<number> {
  const results: { template: string; deleted: boolean }[] = [];
  for (const name of names) results.push({ template: name, deleted: await TemplateBase.delete(name, conn) });
  out.result(results.length === 1 ? results[0] : results, () =>
    results.map((r) => (r.deleted ? `deleted ${r.template}` : `template ${r.template} not found`)),
  );
  const missing = results.filter((r) => !r.deleted).map((r) => r.template);
  if (missing.length > 0 && !out.json)
    throw new CliError(`no template ${missing.join(", ")}`, LIST_HINT, ExitCode.notFound);
  return missing.length > 0 ? ExitCode.notFound : ExitCode.ok;
}

/** `warren template tags NAME`: lists the tags; `--assign` points tags at NAME's build, `--remove` drops them. */
export async function templateTags(
  conn: ConnectionOpts,
  name: string,
  flags: { assign?: string[]; remove?: string[] },
  out: Output,
): Promise<number> {
  try {
    if (flags.assign?.length && flags.remove?.length) {
      throw new CliError("--assign and --remove exclude each other", "run one, then the other", ExitCode.usage);
    }
    if (flags.assign?.length) {
      const assigned = await TemplateBase.assignTags(name, flags.assign, conn);
      out.result(
        { name, ...assigned },
        () => `tagged build ${assigned.buildId} of ${name}: ${assigned.tags.join(", ")}`,
      );
      return ExitCode.ok;
    }
    if (flags.remove?.length) {
      await TemplateBase.removeTags(name, flags.remove, conn);
      out.result({ name, removed: flags.remove }, () => `removed ${flags.remove?.join(", ")} from ${name}`);
      return ExitCode.ok;
    }
    const tags = await TemplateBase.getTags(name, conn);
    out.result(
      tags.map((t) => ({ ...t, createdAt: t.createdAt.toISOString() })),
      () =>
        tags.length === 0
          ? `${name} has no tags`
          : table([["TAG", "BUILD", "ASSIGNED"], ...tags.map((t) => [t.tag, t.buildId, t.createdAt.toISOString()])]),
    );
    return ExitCode.ok;
  } catch (error) {
    throw notFound(error);
  }
}
