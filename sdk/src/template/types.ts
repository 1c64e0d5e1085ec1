import type { PathLike } from "node:fs";
import type { ConnectionOpts } from "../config.js";
import type { LogEntry } from "./logs.js";
import type { ReadyCmd } from "./ready-cmd.js";

/** Options of `Template()`. */
export interface TemplateOptions {
  /** Directory COPY sources are relative to. Default: the directory of the file that called `Template()`. */
  fileContextPath?: PathLike;
  /** Glob patterns of context files never copied (`.dockerignore` lines are added to these). */
  fileIgnorePatterns?: string[];
}

/** The step types of a build (E2B's `TemplateStep.type`). */
export type InstructionType = "RUN" | "COPY" | "ENV" | "WORKDIR" | "USER";

/** One build step as sent to the API (`TemplateStep`); COPY carries its client-side options as E2B's SDK does. */
export interface Instruction {
  type: InstructionType;
  args: string[];
  force: boolean;
  forceUpload?: true;
  resolveSymlinks?: boolean;
  gzip?: boolean;
  filesHash?: string;
}

/** Credentials for a private base image (`fromImageRegistry`). */
export type RegistryConfig =
  | { type: "registry"; username: string; password: string }
  | { type: "aws"; awsAccessKeyId: string; awsSecretAccessKey: string; awsRegion: string }
  | { type: "gcp"; serviceAccountJson: string };

/** The body of `POST /v2/templates/{id}/builds/{buildID}` (`TemplateBuildStartV2`); what `Template.toJSON` prints. */
export interface TemplateSpec {
  startCmd?: string;
  readyCmd?: string;
  steps: Instruction[];
  force: boolean;
  fromImage?: string;
  fromTemplate?: string;
  fromImageRegistry?: RegistryConfig;
}

export interface BasicBuildOptions {
  /** Deprecated: the name (pass it as `Template.build`'s second argument instead). */
  alias: string;
  /** More tags for the build, besides the one in `name:tag` (default `default`). */
  tags?: string[];
  cpuCount?: number;
  memoryMB?: number;
  /** Free disk space to keep in the built template, MiB. */
  minFreeDiskMb?: number;
  /** Rebuild every layer (top-level `force`). */
  skipCache?: boolean;
  onBuildLogs?: (logEntry: LogEntry) => void;
}

export type BuildOptions = ConnectionOpts & BasicBuildOptions;

/** What `build`/`buildInBackground` return. */
export interface BuildInfo {
  /** Deprecated: the same as `name`. */
  alias: string;
  /** The name as passed, tag included. */
  name: string;
  /** The tags the build got (the API's answer). */
  tags: string[];
  templateId: string;
  buildId: string;
}

export type GetBuildStatusOptions = ConnectionOpts & { logsOffset?: number };

export type TemplateBuildStatus = "building" | "waiting" | "ready" | "error";

export interface BuildStatusReason {
  message: string;
  /** `base`, `1`…`N` (1-based step), or `finalize`. */
  step?: string;
  logEntries: LogEntry[];
}

export interface TemplateBuildStatusResponse {
  buildID: string;
  templateID: string;
  status: TemplateBuildStatus;
  logEntries: LogEntry[];
  logs: string[];
  reason?: BuildStatusReason;
}

export interface TemplateTagInfo {
  buildId: string;
  tags: string[];
}

export interface TemplateTag {
  tag: string;
  buildId: string;
  createdAt: Date;
}

/** One source of `copyItems`. */
export interface CopyItem {
  src: PathLike | PathLike[];
  dest: PathLike;
  forceUpload?: true;
  user?: string;
  mode?: number;
  resolveSymlinks?: boolean;
  gzip?: boolean;
}

export interface CopyOptions {
  /** Upload the files even if the server has them already (and rebuild this step). */
  forceUpload?: true;
  /** Owner in the template (`user` or `user:group`); default the current template user. */
  user?: string;
  /** Mode of the copied files, e.g. 0o755. */
  mode?: number;
  /** Copy the files and directories symlinks point to instead of the links. */
  resolveSymlinks?: boolean;
  /** Compress the upload (default true). */
  gzip?: boolean;
}

/** Names of MCP servers `addMcpServer` knows (any string passes through). */
export type McpServerName = string;

/** A template before its base is chosen: every `from*` method. */
export interface TemplateFromImage {
  fromDebianImage(variant?: string): TemplateBuilder;
  fromUbuntuImage(variant?: string): TemplateBuilder;
  fromFedoraImage(variant?: string): TemplateBuilder;
  fromAlpineImage(variant?: string): TemplateBuilder;
  fromArchImage(variant?: string): TemplateBuilder;
  fromPythonImage(version?: string): TemplateBuilder;
  fromNodeImage(variant?: string): TemplateBuilder;
  fromBunImage(variant?: string): TemplateBuilder;
  fromBaseImage(): TemplateBuilder;
  fromImage(baseImage: string, credentials?: { username: string; password: string }): TemplateBuilder;
  fromTemplate(template: string): TemplateBuilder;
  fromDockerfile(dockerfileContentOrPath: string): TemplateBuilder;
  fromAWSRegistry(
    image: string,
    credentials: { accessKeyId: string; secretAccessKey: string; region: string },
  ): TemplateBuilder;
  fromGCPRegistry(image: string, credentials: { serviceAccountJSON: object | string }): TemplateBuilder;
  skipCache(): this;
}

/** A template with a base: the steps, then a start command. */
export interface TemplateBuilder {
  copy(src: PathLike | PathLike[], dest: PathLike, options?: CopyOptions): TemplateBuilder;
  copyItems(items: CopyItem[]): TemplateBuilder;
  remove(
    path: PathLike | PathLike[],
    options?: { force?: boolean; recursive?: boolean; user?: string },
  ): TemplateBuilder;
  rename(src: PathLike, dest: PathLike, options?: { force?: boolean; user?: string }): TemplateBuilder;
  makeDir(path: PathLike | PathLike[], options?: { mode?: number; user?: string }): TemplateBuilder;
  makeSymlink(src: PathLike, dest: PathLike, options?: { user?: string; force?: boolean }): TemplateBuilder;
  runCmd(command: string | string[], options?: { user?: string }): TemplateBuilder;
  setWorkdir(workdir: PathLike): TemplateBuilder;
  setUser(user: string): TemplateBuilder;
  pipInstall(packages?: string | string[], options?: { g?: boolean }): TemplateBuilder;
  npmInstall(packages?: string | string[], options?: { g?: boolean; dev?: boolean }): TemplateBuilder;
  bunInstall(packages?: string | string[], options?: { g?: boolean; dev?: boolean }): TemplateBuilder;
  aptInstall(
    packages: string | string[],
    options?: { noInstallRecommends?: boolean; fixMissing?: boolean },
  ): TemplateBuilder;
  addMcpServer(servers: McpServerName | McpServerName[]): TemplateBuilder;
  gitClone(url: string, path?: PathLike, options?: { branch?: string; depth?: number; user?: string }): TemplateBuilder;
  setEnvs(envs: Record<string, string>): TemplateBuilder;
  skipCache(): this;
  setStartCmd(startCommand: string, readyCommand: string | ReadyCmd): TemplateFinal;
  setReadyCmd(readyCommand: string | ReadyCmd): TemplateFinal;
  betaDevContainerPrebuild(devcontainerDirectory: string): TemplateBuilder;
  betaSetDevContainerStart(devcontainerDirectory: string): TemplateFinal;
}

/** A template with its start command set: nothing more to add, ready for `Template.build`. */
// biome-ignore lint/suspicious/noEmptyInterface: E2B's type-state marker, kept for source compatibility
export interface TemplateFinal {}

/** Any template `Template.build` and `Template.toJSON` accept. */
export type TemplateClass = TemplateBuilder | TemplateFinal;
