import { InvalidArgumentError } from "../errors.js";
import { validateRelativePath } from "./context-files.js";
import { TemplateBase } from "./template.js";
import type { Instruction, InstructionType, RegistryConfig, TemplateOptions, TemplateSpec } from "./types.js";

/**
 * A template file: the document `Template.toJSON` prints (E2B's `TemplateBuildStartV2`), parsed back into a
 * template. Shape:
 *
 * ```json
 * { "fromImage": "ubuntu:22.04",            // or "fromTemplate": "base" — exactly one
 *   "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"},   // optional
 *   "steps": [ {"type": "RUN", "args": ["apt-get update", "root"]},
 *              {"type": "COPY", "args": ["app/", "/app/", "user", "0755"], "forceUpload": true},
 *              {"type": "ENV", "args": ["K", "v"]}, {"type": "WORKDIR", "args": ["/app"]},
 *              {"type": "USER", "args": ["user"]} ],
 *   "startCmd": "python3 -m http.server", "readyCmd": "sleep 2",   // optional
 *   "force": false }                                                 // optional: rebuild everything
 * ```
 *
 * Each step may carry `force: true` (rebuild it and what follows); COPY `args` are `[src, dest, owner?,
 * mode?]` with `src` relative to the context directory; `filesHash` is ignored (recomputed from the files).
 */

const TYPES = new Set<InstructionType>(["RUN", "COPY", "ENV", "WORKDIR", "USER"]);
/** Arity of each step's `args`: [min, max]. */
const ARITY: Record<InstructionType, [number, number]> = {
  RUN: [1, 2],
  COPY: [2, 4],
  ENV: [2, Number.POSITIVE_INFINITY],
  WORKDIR: [1, 1],
  USER: [1, 1],
};

function fail(what: string): never {
  throw new InvalidArgumentError(`template file: ${what}`);
}

function optionalString(doc: Record<string, unknown>, key: string): string | undefined {
  const value = doc[key];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string") fail(`${key} must be a string, got ${JSON.stringify(value)}`);
  return value;
}

function optionalBoolean(doc: Record<string, unknown>, key: string, where: string): boolean | undefined {
  const value = doc[key];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "boolean") fail(`${where}${key} must be true or false, got ${JSON.stringify(value)}`);
  return value;
}

function parseStep(raw: unknown, index: number): Instruction {
  const where = `steps[${index}].`;
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) fail(`steps[${index}] must be an object`);
  const step = raw as Record<string, unknown>;
  const type = String(step.type ?? "").toUpperCase() as InstructionType;
  if (!TYPES.has(type))
    fail(`${where}type must be one of RUN, COPY, ENV, WORKDIR, USER, got ${JSON.stringify(step.type)}`);
  const args = step.args;
  if (!Array.isArray(args) || !args.every((a) => typeof a === "string"))
    fail(`${where}args must be an array of strings`);
  const [min, max] = ARITY[type];
  if (args.length < min || args.length > max) {
    fail(`${where}args of ${type} takes ${min === max ? min : `${min} to ${max}`} values, got ${args.length}`);
  }
  if (type === "ENV" && args.length % 2 !== 0) fail(`${where}args of ENV must be key, value pairs`);
  const instruction: Instruction = { type, args: [...args], force: optionalBoolean(step, "force", where) ?? false };
  if (type === "COPY") {
    while (instruction.args.length < 4) instruction.args.push("");
    validateRelativePath(instruction.args[0] as string);
    if (!/^(|[0-7]{3,4})$/.test(instruction.args[3] as string)) fail(`${where}args[3] (mode) must be octal like 0755`);
    if (optionalBoolean(step, "forceUpload", where)) instruction.forceUpload = true;
    const resolveSymlinks = optionalBoolean(step, "resolveSymlinks", where);
    if (resolveSymlinks !== undefined) instruction.resolveSymlinks = resolveSymlinks;
    const gzip = optionalBoolean(step, "gzip", where);
    if (gzip !== undefined) instruction.gzip = gzip;
  }
  return instruction;
}

function parseRegistry(raw: unknown): RegistryConfig | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== "object" || Array.isArray(raw)) fail("fromImageRegistry must be an object");
  const r = raw as Record<string, unknown>;
  const need = (...keys: string[]) => {
    for (const key of keys) {
      if (typeof r[key] !== "string" || r[key] === "") fail(`fromImageRegistry.${key} must be a non-empty string`);
    }
  };
  switch (r.type) {
    case "registry":
      need("username", "password");
      return { type: "registry", username: String(r.username), password: String(r.password) };
    case "aws":
      need("awsAccessKeyId", "awsSecretAccessKey", "awsRegion");
      return {
        type: "aws",
        awsAccessKeyId: String(r.awsAccessKeyId),
        awsSecretAccessKey: String(r.awsSecretAccessKey),
        awsRegion: String(r.awsRegion),
      };
    case "gcp":
      need("serviceAccountJson");
      return { type: "gcp", serviceAccountJson: String(r.serviceAccountJson) };
    default:
      return fail(`fromImageRegistry.type must be registry, aws or gcp, got ${JSON.stringify(r.type)}`);
  }
}

/** Validates a parsed template file; every error names the field and the value. */
export function parseTemplateSpec(doc: unknown): TemplateSpec {
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) fail("the document must be a JSON object");
  const d = doc as Record<string, unknown>;
  const fromImage = optionalString(d, "fromImage") || undefined;
  const fromTemplate = optionalString(d, "fromTemplate") || undefined;
  if ((fromImage === undefined) === (fromTemplate === undefined)) fail("set exactly one of fromImage and fromTemplate");
  if (d.steps !== undefined && !Array.isArray(d.steps)) fail("steps must be an array");
  const spec: TemplateSpec = {
    steps: ((d.steps as unknown[] | undefined) ?? []).map(parseStep),
    force: optionalBoolean(d, "force", "") ?? false,
  };
  const startCmd = optionalString(d, "startCmd");
  const readyCmd = optionalString(d, "readyCmd");
  if (startCmd !== undefined) spec.startCmd = startCmd;
  if (readyCmd !== undefined) spec.readyCmd = readyCmd;
  if (fromImage !== undefined) spec.fromImage = fromImage;
  if (fromTemplate !== undefined) spec.fromTemplate = fromTemplate;
  const registry = parseRegistry(d.fromImageRegistry);
  if (registry) spec.fromImageRegistry = registry;
  return spec;
}

/** A template from a template file's text; COPY sources resolve against `options.fileContextPath`. */
export function templateFromJSON(text: string, options: TemplateOptions): TemplateBase {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (error) {
    fail(`not JSON: ${(error as Error).message}`);
  }
  return new TemplateBase(options).restore(parseTemplateSpec(doc));
}
