import { ApiClient } from "../api.js";
import type { ConnectionOpts } from "../config.js";
import {
  getBuildStatus,
  getFileUploadLink,
  requestBuild,
  triggerBuild,
  uploadFiles,
  waitForBuildFinish,
} from "./build-api.js";
import { TemplateDefinition } from "./builder.js";
import { TemplateError } from "./errors.js";
import { LogEntry, LogEntryEnd, LogEntryStart } from "./logs.js";
import {
  assignTags,
  checkAliasExists,
  deleteTemplate,
  getTemplate,
  getTemplateTags,
  listTemplates,
  removeTags,
  type TemplateDetail,
  type TemplateInfo,
} from "./template-api.js";
import type {
  BuildInfo,
  BuildOptions,
  GetBuildStatusOptions,
  TemplateBuildStatusResponse,
  TemplateClass,
  TemplateFromImage,
  TemplateOptions,
  TemplateTag,
  TemplateTagInfo,
} from "./types.js";

type NamedBuildOptions = Omit<BuildOptions, "alias">;

function normalizeBuildArguments(
  nameOrOptions: string | BuildOptions,
  options?: NamedBuildOptions,
): { name: string; buildOptions: NamedBuildOptions } {
  let name: string;
  let buildOptions: NamedBuildOptions;
  if (typeof nameOrOptions === "string") {
    name = nameOrOptions;
    buildOptions = options ?? {};
  } else {
    const { alias, ...rest } = nameOrOptions;
    name = alias;
    buildOptions = rest;
  }
  if (!name) throw new TemplateError("Name must be provided");
  return { name, buildOptions };
}

const definition = (template: TemplateClass) => template as TemplateDefinition;

/**
 * Builder and API entry point of templates, E2B's `TemplateBase`: the builder methods (TemplateDefinition) plus
 * the statics that build (`build`, `buildInBackground`, `getBuildStatus`), name (`exists`, tags) and serialize
 * (`toJSON`, `toDockerfile`) templates. Warren extras: `list`, `getInfo`, `delete`.
 */
export class TemplateBase extends TemplateDefinition {
  /** The trigger body of `template` as JSON (2-space indented); with `computeHashes`, COPY steps carry `filesHash`. */
  static async toJSON(template: TemplateClass, computeHashes = true): Promise<string> {
    const t = definition(template);
    return JSON.stringify(t.serialize(computeHashes ? t.stepsWithHashes() : t.steps()), undefined, 2);
  }

  /** A Dockerfile for an image-based template (client-side only). */
  static toDockerfile(template: TemplateClass): string {
    return definition(template).toDockerfileText();
  }

  /** Builds `template` as `name` (`name` or `name:tag`) and waits until it is ready; throws BuildError if not. */
  static async build(template: TemplateClass, name: string, options?: NamedBuildOptions): Promise<BuildInfo>;
  /** @deprecated pass the name as the second argument */
  static async build(template: TemplateClass, options: BuildOptions): Promise<BuildInfo>;
  static async build(
    template: TemplateClass,
    nameOrOptions: string | BuildOptions,
    options?: NamedBuildOptions,
  ): Promise<BuildInfo> {
    const { name, buildOptions } = normalizeBuildArguments(nameOrOptions, options);
    try {
      buildOptions.onBuildLogs?.(new LogEntryStart(new Date(), "Build started"));
      const client = new ApiClient(buildOptions);
      const info = await startBuild(definition(template), client, name, buildOptions);
      buildOptions.onBuildLogs?.(new LogEntry(new Date(), "info", "Waiting for logs..."));
      await waitForBuildFinish(client, info.templateId, info.buildId, {
        onBuildLogs: buildOptions.onBuildLogs,
        stackTraceOfStep: (step) => definition(template).stackTraceOfStep(step),
        signal: buildOptions.signal,
      });
      return info;
    } finally {
      buildOptions.onBuildLogs?.(new LogEntryEnd(new Date(), "Build finished"));
    }
  }

  /** Uploads the files and starts the build, without waiting for it; `getBuildStatus` follows it. */
  static async buildInBackground(
    template: TemplateClass,
    name: string,
    options?: NamedBuildOptions,
  ): Promise<BuildInfo>;
  /** @deprecated pass the name as the second argument */
  static async buildInBackground(template: TemplateClass, options: BuildOptions): Promise<BuildInfo>;
  static async buildInBackground(
    template: TemplateClass,
    nameOrOptions: string | BuildOptions,
    options?: NamedBuildOptions,
  ): Promise<BuildInfo> {
    const { name, buildOptions } = normalizeBuildArguments(nameOrOptions, options);
    return startBuild(definition(template), new ApiClient(buildOptions), name, buildOptions);
  }

  /** One status call: the status and the log entries from `logsOffset` (default 0). */
  static async getBuildStatus(
    data: Pick<BuildInfo, "templateId" | "buildId">,
    options?: GetBuildStatusOptions,
  ): Promise<TemplateBuildStatusResponse> {
    const client = new ApiClient(options);
    return getBuildStatus(client, data.templateId, data.buildId, options?.logsOffset, options?.signal);
  }

  /** Whether a template `name` (optionally `name:tag`) exists; true also when another team owns it. */
  static async exists(name: string, options?: ConnectionOpts): Promise<boolean> {
    return checkAliasExists(new ApiClient(options), name, options?.signal);
  }

  /** @deprecated use `exists` */
  static async aliasExists(alias: string, options?: ConnectionOpts): Promise<boolean> {
    return checkAliasExists(new ApiClient(options), alias, options?.signal);
  }

  /** Points `tags` at the build `targetName` (`name:tag`) resolves to. */
  static async assignTags(
    targetName: string,
    tags: string | string[],
    options?: ConnectionOpts,
  ): Promise<TemplateTagInfo> {
    return assignTags(new ApiClient(options), targetName, Array.isArray(tags) ? tags : [tags], options?.signal);
  }

  /** Removes `tags` from template `name` (never `default`). */
  static async removeTags(name: string, tags: string | string[], options?: ConnectionOpts): Promise<void> {
    return removeTags(new ApiClient(options), name, Array.isArray(tags) ? tags : [tags], options?.signal);
  }

  /** The tags of a template (id or name), each with the build it points to. */
  static async getTags(templateId: string, options?: ConnectionOpts): Promise<TemplateTag[]> {
    return getTemplateTags(new ApiClient(options), templateId, options?.signal);
  }

  /** Warren extra: the team's templates (`GET /templates`). */
  static async list(options?: ConnectionOpts): Promise<TemplateInfo[]> {
    return listTemplates(new ApiClient(options), options?.signal);
  }

  /** Warren extra: one template (id or name) with its builds. */
  static async getInfo(idOrName: string, options?: ConnectionOpts): Promise<TemplateDetail> {
    return getTemplate(new ApiClient(options), idOrName, options?.signal);
  }

  /** Warren extra: deletes a template (id or name); false when there is none. Sandboxes must not use it. */
  static async delete(idOrName: string, options?: ConnectionOpts): Promise<boolean> {
    return deleteTemplate(new ApiClient(options), idOrName, options?.signal);
  }
}

/**
 * Steps 1–4 of a build: create it, hash and upload each COPY's files the server does not have (concurrently),
 * then trigger it with the template document.
 */
async function startBuild(
  template: TemplateDefinition,
  client: ApiClient,
  name: string,
  options: NamedBuildOptions,
): Promise<BuildInfo> {
  const log = (message: string) => options.onBuildLogs?.(new LogEntry(new Date(), "info", message));
  const tags = options.tags && options.tags.length > 0 ? ` with tags ${options.tags.join(", ")}` : "";
  log(`Requesting build for template: ${name}${tags}`);
  const created = await requestBuild(
    client,
    {
      name,
      tags: options.tags,
      cpuCount: options.cpuCount,
      memoryMB: options.memoryMB,
      minFreeDiskMb: options.minFreeDiskMb,
    },
    options.signal,
  );
  log(`Template created with ID: ${created.templateID}, Build ID: ${created.buildID}`);

  const steps = template.stepsWithHashes();
  const ignorePatterns = template.ignorePatterns();
  await Promise.all(
    steps.map(async (step, index) => {
      if (step.type !== "COPY" || step.filesHash === undefined) return;
      const src = step.args[0] as string;
      const stackTrace = template.stackTraceOfStep(String(index + 1));
      const link = await getFileUploadLink(client, created.templateID, step.filesHash, options.signal);
      if (link.url !== undefined && (step.forceUpload || !link.present)) {
        await uploadFiles({
          url: link.url,
          apiUrl: client.config.apiUrl,
          headers: link.headers,
          src,
          contextPath: template.fileContextPath,
          ignorePatterns,
          resolveSymlinks: step.resolveSymlinks ?? false,
          gzip: step.gzip ?? true,
          signal: options.signal,
          requestTimeoutMs: options.requestTimeoutMs,
          stackTrace,
        });
        log(`Uploaded '${src}'`);
      } else {
        log(`Skipping upload of '${src}', already cached`);
      }
    }),
  );
  log("All file uploads completed");
  log("Starting building...");
  await triggerBuild(
    client,
    created.templateID,
    created.buildID,
    template.serialize(steps, options.skipCache === true),
    options.signal,
  );
  return { alias: name, name, tags: created.tags, templateId: created.templateID, buildId: created.buildID };
}

/** `Template` called as a function makes a builder; its statics are TemplateBase's. */
export type CallableTemplate = typeof TemplateBase & ((options?: TemplateOptions) => TemplateFromImage);

/**
 * Template builder and API, E2B's `Template`: `Template({fileContextPath}).fromImage(...)...`, then
 * `Template.build(template, 'name:tag')`.
 */
export const Template: CallableTemplate = new Proxy(TemplateBase, {
  apply(target, _thisArg, args: [TemplateOptions?]) {
    return new target(...args);
  },
}) as CallableTemplate;
