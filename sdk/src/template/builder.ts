import { type PathLike, readFileSync } from "node:fs";
import { join } from "node:path";
import { InvalidArgumentError } from "../errors.js";
import { callerDirectory, callerFrame } from "./caller.js";
import { calculateFilesHash, readDockerignore, validateRelativePath } from "./context-files.js";
import { applyDockerfile } from "./dockerfile.js";
import { atCaller, BuildError } from "./errors.js";
import { ReadyCmd, waitForFile } from "./ready-cmd.js";
import { padOctal, shellQuote } from "./shell.js";
import type {
  CopyItem,
  CopyOptions,
  Instruction,
  McpServerName,
  RegistryConfig,
  TemplateBuilder,
  TemplateFinal,
  TemplateFromImage,
  TemplateOptions,
  TemplateSpec,
} from "./types.js";

const DEFAULT_BASE_IMAGE = "e2bdev/base";

/**
 * A template definition: a base (image or template), steps, start and ready commands. Each builder method
 * records what E2B's SDK records for it (E2B-TEMPLATES.md §3.1), so `Template.toJSON` of the same calls is the
 * same document. `skipCache()` marks every later step `force`, and a later `from*` call the whole template.
 */
export class TemplateDefinition implements TemplateFromImage, TemplateBuilder, TemplateFinal {
  private baseImage: string | undefined = DEFAULT_BASE_IMAGE;
  private baseTemplate: string | undefined;
  private registryConfig: RegistryConfig | undefined;
  private startCmd: string | undefined;
  private readyCmd: string | undefined;
  private force = false;
  private forceNextLayer = false;
  private instructions: Instruction[] = [];
  /** The user's call site per recorded call: [0] the base, then one per step, last the start command. */
  private readonly stackTraces: (string | undefined)[] = [];
  readonly fileContextPath: string;
  readonly fileIgnorePatterns: string[];

  constructor(options?: TemplateOptions) {
    this.fileContextPath = (options?.fileContextPath ?? callerDirectory() ?? ".").toString();
    this.fileIgnorePatterns = options?.fileIgnorePatterns ?? [];
  }

  fromDebianImage(variant = "stable"): TemplateBuilder {
    return this.fromImage(`debian:${variant}`);
  }

  fromUbuntuImage(variant = "latest"): TemplateBuilder {
    return this.fromImage(`ubuntu:${variant}`);
  }

  fromFedoraImage(variant = "44"): TemplateBuilder {
    return this.fromImage(`fedora:${variant}`);
  }

  fromAlpineImage(variant = "3.24"): TemplateBuilder {
    return this.fromImage(`alpine:${variant}`);
  }

  fromArchImage(variant = "latest"): TemplateBuilder {
    return this.fromImage(`archlinux:${variant}`);
  }

  fromPythonImage(version = "3"): TemplateBuilder {
    return this.fromImage(`python:${version}`);
  }

  fromNodeImage(variant = "lts"): TemplateBuilder {
    return this.fromImage(`node:${variant}`);
  }

  fromBunImage(variant = "latest"): TemplateBuilder {
    return this.fromImage(`oven/bun:${variant}`);
  }

  fromBaseImage(): TemplateBuilder {
    return this.fromImage(DEFAULT_BASE_IMAGE);
  }

  fromImage(baseImage: string, credentials?: { username: string; password: string }): TemplateBuilder {
    if (credentials && (!credentials.username || !credentials.password)) {
      throw atCaller(
        new InvalidArgumentError("Both username and password are required when providing registry credentials"),
        callerFrame(),
      );
    }
    if (credentials) {
      this.registryConfig = { type: "registry", username: credentials.username, password: credentials.password };
    }
    return this.setBase(baseImage, undefined);
  }

  fromTemplate(template: string): TemplateBuilder {
    return this.setBase(undefined, template);
  }

  fromDockerfile(dockerfileContentOrPath: string): TemplateBuilder {
    return this.fromDockerfileWithWarnings(dockerfileContentOrPath, console.warn);
  }

  /** `fromDockerfile`, reporting skipped instructions to `warn` instead of the console. */
  fromDockerfileWithWarnings(dockerfileContentOrPath: string, warn: (message: string) => void): TemplateBuilder {
    const baseImage = applyDockerfile(dockerfileContentOrPath, this, warn);
    return this.setBase(baseImage, undefined);
  }

  fromAWSRegistry(
    image: string,
    credentials: { accessKeyId: string; secretAccessKey: string; region: string },
  ): TemplateBuilder {
    this.registryConfig = {
      type: "aws",
      awsAccessKeyId: credentials.accessKeyId,
      awsSecretAccessKey: credentials.secretAccessKey,
      awsRegion: credentials.region,
    };
    return this.setBase(image, undefined);
  }

  fromGCPRegistry(image: string, credentials: { serviceAccountJSON: object | string }): TemplateBuilder {
    const json = credentials.serviceAccountJSON;
    this.registryConfig = {
      type: "gcp",
      serviceAccountJson:
        typeof json === "string" ? readFileSync(join(this.fileContextPath, json), "utf8") : JSON.stringify(json),
    };
    return this.setBase(image, undefined);
  }

  private setBase(image: string | undefined, template: string | undefined): TemplateBuilder {
    this.baseImage = image;
    this.baseTemplate = template;
    if (this.forceNextLayer) this.force = true;
    this.stackTraces.push(callerFrame());
    return this;
  }

  copy(src: PathLike | PathLike[], dest: PathLike, options?: CopyOptions): TemplateBuilder {
    const stackTrace = callerFrame();
    for (const one of Array.isArray(src) ? src : [src]) {
      const source = one.toString();
      validateRelativePath(source, stackTrace);
      this.instructions.push({
        type: "COPY",
        args: [source, dest.toString(), options?.user ?? "", options?.mode ? padOctal(options.mode) : ""],
        force: options?.forceUpload || this.forceNextLayer,
        forceUpload: options?.forceUpload,
        resolveSymlinks: options?.resolveSymlinks,
        gzip: options?.gzip,
      });
      this.stackTraces.push(stackTrace);
    }
    return this;
  }

  copyItems(items: CopyItem[]): TemplateBuilder {
    for (const item of items) {
      this.copy(item.src, item.dest, {
        forceUpload: item.forceUpload,
        user: item.user,
        mode: item.mode,
        resolveSymlinks: item.resolveSymlinks,
        gzip: item.gzip,
      });
    }
    return this;
  }

  remove(path: PathLike | PathLike[], options?: { force?: boolean; recursive?: boolean; user?: string }) {
    const args = ["rm"];
    if (options?.recursive) args.push("-r");
    if (options?.force) args.push("-f");
    args.push(...paths(path).map(shellQuote));
    return this.runCmd(args.join(" "), { user: options?.user });
  }

  rename(src: PathLike, dest: PathLike, options?: { force?: boolean; user?: string }): TemplateBuilder {
    const args = ["mv", shellQuote(src.toString()), shellQuote(dest.toString())];
    if (options?.force) args.push("-f");
    return this.runCmd(args.join(" "), { user: options?.user });
  }

  makeDir(path: PathLike | PathLike[], options?: { mode?: number; user?: string }): TemplateBuilder {
    const args = ["mkdir", "-p"];
    if (options?.mode) args.push(`-m ${padOctal(options.mode)}`);
    args.push(...paths(path).map(shellQuote));
    return this.runCmd(args.join(" "), { user: options?.user });
  }

  makeSymlink(src: PathLike, dest: PathLike, options?: { user?: string; force?: boolean }): TemplateBuilder {
    const args = ["ln", "-s"];
    if (options?.force) args.push("-f");
    args.push(shellQuote(src.toString()), shellQuote(dest.toString()));
    return this.runCmd(args.join(" "), { user: options?.user });
  }

  runCmd(command: string | string[], options?: { user?: string }): TemplateBuilder {
    const args = [(Array.isArray(command) ? command : [command]).join(" && ")];
    if (options?.user) args.push(options.user);
    return this.push("RUN", args);
  }

  setWorkdir(workdir: PathLike): TemplateBuilder {
    return this.push("WORKDIR", [workdir.toString()]);
  }

  setUser(user: string): TemplateBuilder {
    return this.push("USER", [user]);
  }

  pipInstall(packages?: string | string[], options?: { g?: boolean }): TemplateBuilder {
    const g = options?.g ?? true;
    const args = ["pip", "install"];
    if (!g) args.push("--user");
    const list = packageList(packages);
    args.push(...(list ?? ["."]));
    return this.runCmd(args.join(" "), { user: g ? "root" : undefined });
  }

  npmInstall(packages?: string | string[], options?: { g?: boolean; dev?: boolean }): TemplateBuilder {
    return this.jsInstall("npm", "--save-dev", packages, options);
  }

  bunInstall(packages?: string | string[], options?: { g?: boolean; dev?: boolean }): TemplateBuilder {
    return this.jsInstall("bun", "--dev", packages, options);
  }

  private jsInstall(
    tool: string,
    devFlag: string,
    packages: string | string[] | undefined,
    options: { g?: boolean; dev?: boolean } | undefined,
  ): TemplateBuilder {
    const args = [tool, "install"];
    if (options?.g) args.push("-g");
    if (options?.dev) args.push(devFlag);
    args.push(...(packageList(packages) ?? []));
    return this.runCmd(args.join(" "), { user: options?.g ? "root" : undefined });
  }

  aptInstall(
    packages: string | string[],
    options?: { noInstallRecommends?: boolean; fixMissing?: boolean },
  ): TemplateBuilder {
    const flags = `${options?.noInstallRecommends ? "--no-install-recommends " : ""}${options?.fixMissing ? "--fix-missing " : ""}`;
    const list = (Array.isArray(packages) ? packages : [packages]).join(" ");
    return this.runCmd(
      ["apt-get update", `DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y ${flags}${list}`],
      { user: "root" },
    );
  }

  addMcpServer(servers: McpServerName | McpServerName[]): TemplateBuilder {
    if (this.baseTemplate !== "mcp-gateway") {
      throw new BuildError("MCP servers can only be added to mcp-gateway template", callerFrame());
    }
    const list = Array.isArray(servers) ? servers : [servers];
    return this.runCmd(`mcp-gateway pull ${list.join(" ")}`, { user: "root" });
  }

  gitClone(url: string, path?: PathLike, options?: { branch?: string; depth?: number; user?: string }) {
    const args = ["git", "clone", shellQuote(url)];
    if (options?.branch) args.push(`--branch ${shellQuote(options.branch)}`, "--single-branch");
    if (options?.depth) args.push(`--depth ${options.depth}`);
    if (path) args.push(shellQuote(path.toString()));
    return this.runCmd(args.join(" "), { user: options?.user });
  }

  setStartCmd(startCommand: string, readyCommand: string | ReadyCmd): TemplateFinal {
    this.startCmd = startCommand;
    this.readyCmd = readyCommand instanceof ReadyCmd ? readyCommand.getCmd() : readyCommand;
    this.stackTraces.push(callerFrame());
    return this;
  }

  setReadyCmd(readyCommand: string | ReadyCmd): TemplateFinal {
    this.readyCmd = readyCommand instanceof ReadyCmd ? readyCommand.getCmd() : readyCommand;
    this.stackTraces.push(callerFrame());
    return this;
  }

  setEnvs(envs: Record<string, string>): TemplateBuilder {
    if (Object.keys(envs).length === 0) return this;
    return this.push("ENV", Object.entries(envs).flat());
  }

  skipCache(): this {
    this.forceNextLayer = true;
    return this;
  }

  betaDevContainerPrebuild(devcontainerDirectory: string): TemplateBuilder {
    this.requireDevcontainer();
    return this.runCmd(`devcontainer build --workspace-folder ${shellQuote(devcontainerDirectory)}`, {
      user: "root",
    });
  }

  betaSetDevContainerStart(devcontainerDirectory: string): TemplateFinal {
    this.requireDevcontainer();
    const dir = shellQuote(devcontainerDirectory);
    return this.setStartCmd(
      `sudo devcontainer up --workspace-folder ${dir} && sudo /prepare-exec.sh ${dir} | sudo tee /devcontainer.sh > /dev/null && sudo chmod +x /devcontainer.sh && sudo touch /devcontainer.up`,
      waitForFile("/devcontainer.up"),
    );
  }

  private requireDevcontainer(): void {
    if (this.baseTemplate !== "devcontainer") {
      throw new BuildError("Devcontainers can only used in the devcontainer template", callerFrame());
    }
  }

  private push(type: Instruction["type"], args: string[]): this {
    this.instructions.push({ type, args, force: this.forceNextLayer });
    this.stackTraces.push(callerFrame());
    return this;
  }

  // -------------------------------------------------------------------------------------------------------------
  // Used by Template's statics, the build and the CLI; not part of E2B's builder surface.

  /** `.dockerignore` lines after `fileIgnorePatterns`. */
  ignorePatterns(): string[] {
    return [...this.fileIgnorePatterns, ...readDockerignore(this.fileContextPath)];
  }

  /** The steps, COPY steps with their `filesHash` (which reads the context files). */
  stepsWithHashes(): Instruction[] {
    const ignore = this.ignorePatterns();
    return this.instructions.map((instruction, index) => {
      if (instruction.type !== "COPY") return instruction;
      const [src, dest] = instruction.args as [string, string];
      try {
        const hash = calculateFilesHash(src, dest, this.fileContextPath, ignore, instruction.resolveSymlinks ?? false);
        return { ...instruction, filesHash: hash };
      } catch (error) {
        throw atCaller(error as Error, this.stackTraceOfStep(String(index + 1)));
      }
    });
  }

  /** The steps as recorded, without hashes. */
  steps(): Instruction[] {
    return this.instructions.map((i) => ({ ...i }));
  }

  /** The trigger body (`Template.toJSON`'s document). `forceAll` sets top-level `force` (build's `skipCache`). */
  serialize(steps: Instruction[], forceAll = false): TemplateSpec {
    const spec: TemplateSpec = {
      startCmd: this.startCmd,
      readyCmd: this.readyCmd,
      steps,
      force: this.force || forceAll,
    };
    if (this.baseImage !== undefined) spec.fromImage = this.baseImage;
    if (this.baseTemplate !== undefined) spec.fromTemplate = this.baseTemplate;
    if (this.registryConfig !== undefined) spec.fromImageRegistry = this.registryConfig;
    return spec;
  }

  /** The user's call that recorded a build step: `base`, `1`…`N`, or `finalize` (the last call). */
  stackTraceOfStep(step: string): string | undefined {
    if (step === "base") return this.stackTraces[0];
    if (step === "finalize") return this.stackTraces[this.stackTraces.length - 1];
    const n = Number(step);
    return Number.isInteger(n) ? this.stackTraces[n] : undefined;
  }

  /** A Dockerfile of an image-based template (client-side only, as E2B's `toDockerfile`). */
  toDockerfileText(): string {
    if (this.baseTemplate !== undefined) {
      throw new Error(
        "Cannot convert template built from another template to Dockerfile. Templates based on other templates can only be built using the E2B API.",
      );
    }
    if (this.baseImage === undefined) throw new Error("No base image specified for template");
    let dockerfile = `FROM ${this.baseImage}\n`;
    for (const { type, args } of this.instructions) {
      if (type === "RUN") dockerfile += `RUN ${args[0]}\n`;
      else if (type === "COPY") dockerfile += `COPY ${args[0]} ${args[1]}\n`;
      else if (type === "ENV") {
        const values: string[] = [];
        for (let i = 0; i < args.length; i += 2) values.push(`${args[i]}=${args[i + 1]}`);
        dockerfile += `ENV ${values.join(" ")}\n`;
      } else dockerfile += `${type} ${args.join(" ")}\n`;
    }
    if (this.startCmd) dockerfile += `ENTRYPOINT ${this.startCmd}\n`;
    return dockerfile;
  }

  /** Replaces this definition with a parsed template document (template files of the CLI). */
  restore(spec: TemplateSpec): this {
    this.baseImage = spec.fromImage;
    this.baseTemplate = spec.fromTemplate;
    this.registryConfig = spec.fromImageRegistry;
    this.startCmd = spec.startCmd;
    this.readyCmd = spec.readyCmd;
    this.force = spec.force;
    this.instructions = spec.steps.map(({ filesHash: _ignored, ...step }) => step);
    this.stackTraces.length = 0;
    return this;
  }
}

function paths(path: PathLike | PathLike[]): string[] {
  return (Array.isArray(path) ? path : [path]).map((p) => p.toString());
}

function packageList(packages: string | string[] | undefined): string[] | undefined {
  if (!packages) return undefined;
  return Array.isArray(packages) ? packages : [packages];
}
