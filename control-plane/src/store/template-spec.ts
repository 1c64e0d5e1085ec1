/**
 * A build's steps as the api stores them (E2B's TemplateBuildStartV2, parsed at the edge): the one shape the api
 * writes into `template_builds.spec` and the master's builder reads back.
 */

export type StepType = "RUN" | "COPY" | "ENV" | "WORKDIR" | "USER";

export interface TemplateStep {
  readonly type: StepType;
  readonly args: readonly string[];
  readonly force: boolean;
  readonly filesHash?: string;
}

export interface RegistryCredentials {
  readonly type: "registry" | "aws" | "gcp";
  readonly username?: string;
  readonly password?: string;
  /** `fromAWSRegistry`'s keys, exchanged by the api for an ECR login (api/ecr-login.ts); never stored. */
  readonly aws?: AwsKeys;
}

export interface AwsKeys {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly region: string;
}

const AWS_REGION = /^[a-z]{2}(-[a-z]+)+-\d{1,2}$/;

/**
 * `fromAWSRegistry`: the keys and region as the SDK sends them. ECR takes no keys as a registry login: they are
 * exchanged for a token first (GetAuthorizationToken), which the api does at the trigger.
 */
function awsKeys(r: Record<string, unknown>): RegistryCredentials {
  const { awsAccessKeyId: id, awsSecretAccessKey: secret, awsRegion: region } = r;
  // A stored spec keeps only the type (the login went to the master with the trigger).
  if (id === undefined && secret === undefined && region === undefined) return { type: "aws" };
  if (typeof id !== "string" || id === "" || typeof secret !== "string" || secret === "") {
    throw new BuildSpecError("fromImageRegistry type 'aws' needs awsAccessKeyId and awsSecretAccessKey");
  }
  if (typeof region !== "string" || !AWS_REGION.test(region)) {
    throw new BuildSpecError(`fromImageRegistry.awsRegion must be an AWS region such as us-east-1, got '${region}'`);
  }
  return { type: "aws", aws: { accessKeyId: id, secretAccessKey: secret, region } };
}

/**
 * `fromGCPRegistry`: Google's registries (Artifact Registry, gcr.io) take a service account key as a basic-auth
 * password for the user `_json_key` (what `docker login -u _json_key` does), so the key itself is the login and
 * no token is fetched from Google first.
 */
function gcpLogin(serviceAccountJson: unknown): RegistryCredentials {
  // A stored spec keeps only the type (the key went to the master with the trigger).
  if (serviceAccountJson === undefined) return { type: "gcp" };
  let key: unknown;
  try {
    key = typeof serviceAccountJson === "string" ? JSON.parse(serviceAccountJson) : undefined;
  } catch {
    key = undefined;
  }
  if (typeof key !== "object" || key === null || Array.isArray(key)) {
    throw new BuildSpecError("fromImageRegistry.serviceAccountJson must be a service account key as JSON text");
  }
  return { type: "gcp", username: "_json_key", password: serviceAccountJson as string };
}

export interface TemplateBuildSpec {
  readonly fromTemplate?: string;
  readonly fromImage?: string;
  /**
   * A Debian system the node makes with debootstrap (the suite's minbase and these packages): the base of Warren's
   * own recipes (templates/catalog.ts). Never taken from a request: only a stored spec Warren wrote holds it.
   */
  readonly fromDebian?: {
    readonly suite: string;
    readonly packages: readonly string[];
    readonly aptPackages?: readonly string[];
  };
  /** The node every part of the build runs on (a shipped template built for the node that awaits it); stored only. */
  readonly onNode?: string;
  readonly fromImageRegistry?: RegistryCredentials;
  readonly force: boolean;
  readonly startCmd: string | null;
  readonly readyCmd: string | null;
  readonly steps: readonly TemplateStep[];
}

export class BuildSpecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BuildSpecError";
  }
}

const STEP_TYPES: Record<string, StepType> = {
  RUN: "RUN",
  COPY: "COPY",
  ADD: "COPY",
  ENV: "ENV",
  ARG: "ENV",
  WORKDIR: "WORKDIR",
  USER: "USER",
};

const MAX_STEPS = 512;
const MAX_ARG = 64 * 1024;

function optionalString(value: unknown, field: string): string | undefined {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value !== "string") throw new BuildSpecError(`${field} must be a string`);
  if (value.includes("\0")) throw new BuildSpecError(`${field} must not contain NUL characters`);
  return value;
}

function parseStep(raw: unknown, index: number): TemplateStep {
  const where = `steps[${index}]`;
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) throw new BuildSpecError(`${where} must be an object`);
  const s = raw as Record<string, unknown>;
  if (typeof s.type !== "string") throw new BuildSpecError(`${where}.type must be a string`);
  const type = STEP_TYPES[s.type.toUpperCase()];
  if (!type) throw new BuildSpecError(`${where}: command type ${s.type} is not implemented`);
  const args = s.args ?? [];
  if (!Array.isArray(args) || args.some((a) => typeof a !== "string")) {
    throw new BuildSpecError(`${where}.args must be an array of strings`);
  }
  for (const arg of args as string[]) {
    if (arg.length > MAX_ARG)
      throw new BuildSpecError(`${where}.args: an argument is longer than ${MAX_ARG} characters`);
    if (arg.includes("\0")) throw new BuildSpecError(`${where}.args must not contain NUL characters`);
  }
  if (s.force !== undefined && typeof s.force !== "boolean")
    throw new BuildSpecError(`${where}.force must be a boolean`);
  const filesHash = optionalString(s.filesHash, `${where}.filesHash`);
  if (filesHash !== undefined && !/^[0-9a-f]{64}$/.test(filesHash)) {
    throw new BuildSpecError(`${where}.filesHash: Invalid files hash '${filesHash}'`);
  }
  if (type === "COPY" && filesHash === undefined) throw new BuildSpecError(`${where}: COPY needs a filesHash`);
  return { type, args: args as string[], force: s.force === true, ...(filesHash ? { filesHash } : {}) };
}

/** Parses E2B's TemplateBuildStartV2; unknown keys (the SDK leaks some client options) are ignored. */
export function parseBuildSpec(raw: unknown): TemplateBuildSpec {
  return parseSpec(raw, false);
}

/** A spec as the builder reads it back from its row: a request's, or one of Warren's recipes (`fromDebian`). */
export function parseStoredBuildSpec(raw: unknown): TemplateBuildSpec {
  return parseSpec(raw, true);
}

function parseDebian(raw: unknown): { suite: string; packages: string[]; aptPackages?: string[] } {
  const d = raw as Record<string, unknown>;
  if (typeof d !== "object" || d === null || typeof d.suite !== "string") {
    throw new BuildSpecError("fromDebian.suite must be a string");
  }
  const packages = d.packages ?? [];
  if (!Array.isArray(packages) || packages.some((p) => typeof p !== "string")) {
    throw new BuildSpecError("fromDebian.packages must be an array of strings");
  }
  const apt = d.aptPackages ?? [];
  if (!Array.isArray(apt) || apt.some((p) => typeof p !== "string")) {
    throw new BuildSpecError("fromDebian.aptPackages must be an array of strings");
  }
  return {
    suite: d.suite,
    packages: packages as string[],
    ...(apt.length > 0 ? { aptPackages: apt as string[] } : {}),
  };
}

function parseSpec(raw: unknown, stored: boolean): TemplateBuildSpec {
  if (!raw || typeof raw !== "object" || Array.isArray(raw))
    throw new BuildSpecError("request body must be a JSON object");
  const b = raw as Record<string, unknown>;
  const fromTemplate = optionalString(b.fromTemplate, "fromTemplate");
  const fromImage = optionalString(b.fromImage, "fromImage");
  const fromDebian = stored && b.fromDebian !== undefined ? parseDebian(b.fromDebian) : undefined;
  const onNode = stored ? optionalString(b.onNode, "onNode") : undefined;
  if ([fromTemplate, fromImage, fromDebian].filter(Boolean).length > 1) {
    throw new BuildSpecError("give either fromImage or fromTemplate, not both");
  }
  if (!fromTemplate && !fromImage && !fromDebian) {
    throw new BuildSpecError("one of fromImage or fromTemplate is required");
  }
  if (b.force !== undefined && typeof b.force !== "boolean") throw new BuildSpecError("force must be a boolean");
  const steps = b.steps ?? [];
  if (!Array.isArray(steps)) throw new BuildSpecError("steps must be an array");
  if (steps.length > MAX_STEPS)
    throw new BuildSpecError(`a template has at most ${MAX_STEPS} steps, got ${steps.length}`);
  let registry: RegistryCredentials | undefined;
  // A registry sent with fromTemplate is ignored (the SDK keeps an earlier fromImage's credentials).
  if (fromImage && b.fromImageRegistry !== undefined && b.fromImageRegistry !== null) {
    const r = b.fromImageRegistry as Record<string, unknown>;
    if (typeof r !== "object" || (r.type !== "registry" && r.type !== "aws" && r.type !== "gcp")) {
      throw new BuildSpecError("fromImageRegistry.type must be registry, aws or gcp");
    }
    registry =
      r.type === "gcp"
        ? gcpLogin(r.serviceAccountJson)
        : r.type === "aws"
          ? awsKeys(r)
          : {
              type: r.type,
              ...(typeof r.username === "string" ? { username: r.username } : {}),
              ...(typeof r.password === "string" ? { password: r.password } : {}),
            };
  }
  return {
    ...(fromTemplate ? { fromTemplate } : {}),
    ...(fromImage ? { fromImage } : {}),
    ...(fromDebian ? { fromDebian } : {}),
    ...(onNode ? { onNode } : {}),
    ...(registry ? { fromImageRegistry: registry } : {}),
    force: b.force === true,
    startCmd: optionalString(b.startCmd, "startCmd") ?? null,
    readyCmd: optionalString(b.readyCmd, "readyCmd") ?? null,
    steps: steps.map(parseStep),
  };
}
