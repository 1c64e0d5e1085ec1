/** Rendering the chart with helm and reading what it rendered: manifests, workloads, containers, environment. */
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parse, parseAllDocuments } from "yaml";
import { CHART_DIR, helm } from "./helm.js";

// biome-ignore lint/suspicious/noExplicitAny: rendered manifests are untyped YAML.
export type Manifest = Record<string, any>;

export const RELEASE = "wr";
export const NAMESPACE = "sandboxes";

/** The documented profiles: ci/*.yaml, plus the default values (no file). */
export const PROFILES: readonly (string | undefined)[] = [
  undefined,
  ...readdirSync(join(CHART_DIR, "ci"))
    .filter((name) => name.endsWith(".yaml"))
    .sort()
    .map((name) => `ci/${name}`),
];

function merge(base: Manifest, override: Manifest): Manifest {
  const out: Manifest = { ...base };
  for (const [key, value] of Object.entries(override)) {
    const isObject = (v: unknown) => v !== null && typeof v === "object" && !Array.isArray(v);
    out[key] = isObject(value) && isObject(base[key]) ? merge(base[key], value) : value;
  }
  return out;
}

/** The values a profile renders with: values.yaml deep-merged with the profile's file, as helm merges them. */
export function profileValues(profile: string | undefined): Manifest {
  const defaults = parse(readFileSync(join(CHART_DIR, "values.yaml"), "utf8"));
  return profile ? merge(defaults, parse(readFileSync(join(CHART_DIR, profile), "utf8"))) : defaults;
}

export function profileName(profile: string | undefined): string {
  return profile ?? "default values";
}

/**
 * `helm template` arguments for a profile (a values file under the chart) and extra flags: `key=value` is a
 * --set (ints, booleans and strings), `json:key=value` a --set-json (for floats and typed values).
 */
export function templateArgs(profile: string | undefined, sets: readonly string[] = []): string[] {
  return [
    "template",
    RELEASE,
    CHART_DIR,
    "--namespace",
    NAMESPACE,
    ...(profile ? ["--values", join(CHART_DIR, profile)] : []),
    ...sets.flatMap((set) => (set.startsWith("json:") ? ["--set-json", set.slice(5)] : ["--set", set])),
  ];
}

export async function render(profile: string | undefined, sets: readonly string[] = []): Promise<Manifest[]> {
  const result = await helm(templateArgs(profile, sets));
  if (result.code !== 0) throw new Error(`helm template (${profileName(profile)}) failed: ${result.stderr}`);
  return parseManifests(result.stdout);
}

export function parseManifests(text: string): Manifest[] {
  const out: Manifest[] = [];
  for (const document of parseAllDocuments(text)) {
    if (document.errors.length > 0) throw new Error(`rendered YAML does not parse: ${document.errors[0]?.message}`);
    const value = document.toJS();
    if (value !== null && value !== undefined) out.push(value as Manifest);
  }
  return out;
}

export function find(manifests: readonly Manifest[], kind: string, name: string): Manifest | undefined {
  return manifests.find((m) => m.kind === kind && m.metadata?.name === name);
}

export function get(manifests: readonly Manifest[], kind: string, name: string): Manifest {
  const found = find(manifests, kind, name);
  if (!found) throw new Error(`no ${kind} ${name} among ${manifests.map((m) => `${m.kind}/${m.metadata?.name}`)}`);
  return found;
}

const WORKLOADS = new Set(["Deployment", "DaemonSet", "StatefulSet"]);

export function workloads(manifests: readonly Manifest[]): Manifest[] {
  return manifests.filter((m) => WORKLOADS.has(m.kind));
}

/** The one Warren container of a component (api, master, proxy, node-agent). */
export function componentContainer(manifests: readonly Manifest[], component: string): Manifest {
  const workload = workloads(manifests).find(
    (m) => m.spec.template.metadata.labels["app.kubernetes.io/component"] === component,
  );
  if (!workload) throw new Error(`no workload for component ${component}`);
  return workload.spec.template.spec.containers[0];
}

/** Value for a secretKeyRef: a stand-in that the processes accept (long enough, URL-safe). */
export type SecretValues = (name: string, key: string) => string;

const STAND_IN: SecretValues = (_name, key) => {
  // WARREN_SECRETS_KEYS: `<id>:<base64 of 32 bytes>`.
  if (key === "secretsKeys") return `k1:${Buffer.alloc(32, 7).toString("base64")}`;
  if (/url/i.test(key)) return key.toLowerCase().includes("redis") ? "redis://:pw@redis:6379" : "postgres://u@db/x";
  return "stand-in-secret-value-0123456789";
};

/** What the downward API would give for a field ref (addresses: a sample node IP). */
const FIELD_SAMPLES: Record<string, string> = {
  "metadata.namespace": NAMESPACE,
  "metadata.name": `${RELEASE}-warren-master-7d9f8c6b5-x2x7q`,
  "spec.nodeName": "sandbox-node-1",
};

/**
 * The environment a container starts with: envFrom ConfigMaps, then env (secret refs replaced by stand-ins,
 * field refs by sample values, `$(VAR)` expanded as the kubelet does).
 */
export function containerEnv(
  manifests: readonly Manifest[],
  container: Manifest,
  secret: SecretValues = STAND_IN,
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const source of container.envFrom ?? []) {
    const configMap = get(manifests, "ConfigMap", source.configMapRef.name);
    Object.assign(env, configMap.data);
  }
  for (const entry of container.env ?? []) {
    if (entry.value !== undefined) {
      env[entry.name] = String(entry.value).replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name: string) =>
        name in env ? (env[name] as string) : whole,
      );
    } else if (entry.valueFrom?.secretKeyRef) {
      env[entry.name] = secret(entry.valueFrom.secretKeyRef.name, entry.valueFrom.secretKeyRef.key);
    } else if (entry.valueFrom?.fieldRef) {
      env[entry.name] = FIELD_SAMPLES[entry.valueFrom.fieldRef.fieldPath as string] ?? "192.0.2.10";
    } else {
      throw new Error(`env ${entry.name} has no value the test understands`);
    }
  }
  return env;
}

/** Every env variable name a container can see (ConfigMaps and env entries). */
export function envNames(manifests: readonly Manifest[], container: Manifest): string[] {
  return Object.keys(containerEnv(manifests, container));
}

/**
 * NOTES.txt as `helm install` would print it. `helm template` never renders NOTES.txt and `helm install
 * --dry-run` needs a cluster, so a copy of the chart renders the same text through `tpl` into a ConfigMap.
 */
export async function renderNotes(profile: string | undefined, sets: readonly string[] = []): Promise<string> {
  const copy = mkdtempSync(join(tmpdir(), "warren-chart-"));
  try {
    const chart = join(copy, "warren");
    cpSync(CHART_DIR, chart, { recursive: true });
    cpSync(join(chart, "templates", "NOTES.txt"), join(chart, "notes.txt"));
    rmSync(join(chart, "templates", "NOTES.txt"));
    writeFileSync(
      join(chart, "templates", "notes-under-test.yaml"),
      'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n',
    );
    const args = templateArgs(profile, sets).map((arg) => (arg === CHART_DIR ? chart : arg));
    const result = await helm([...args, "--show-only", "templates/notes-under-test.yaml"]);
    if (result.code !== 0) throw new Error(`rendering NOTES.txt (${profileName(profile)}) failed: ${result.stderr}`);
    return parseManifests(result.stdout)[0]?.data.notes as string;
  } finally {
    rmSync(copy, { recursive: true, force: true });
  }
}
