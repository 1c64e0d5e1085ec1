/**
 * Validation of rendered manifests against the Kubernetes API schemas, offline, with kubernetes-models (the
 * OpenAPI schemas of Kubernetes 1.27). It checks types, required fields and enums; like the models, it does not
 * catch unknown fields. Custom resources (the ServiceMonitor) have no model there: they get a structural check.
 */
import type { Manifest } from "./manifests.js";

interface Validatable {
  validate(): void;
}
type ModelClass = new (data: Manifest) => Validatable;

/** kubernetes-models subpath of an apiVersion: "v1" → "v1", "apps/v1" → "apps/v1", "policy/v1" → "policy/v1". */
function modelModule(apiVersion: string): string {
  return `kubernetes-models/${apiVersion}`;
}

async function modelClass(apiVersion: string, kind: string): Promise<ModelClass | undefined> {
  let module: Record<string, unknown>;
  try {
    module = (await import(modelModule(apiVersion))) as Record<string, unknown>;
  } catch {
    return undefined;
  }
  const model = module[kind];
  return typeof model === "function" ? (model as ModelClass) : undefined;
}

function serviceMonitorErrors(m: Manifest): string[] {
  const errors: string[] = [];
  const labels = m.spec?.selector?.matchLabels;
  if (!labels || typeof labels !== "object" || Object.keys(labels).length === 0) {
    errors.push("spec.selector.matchLabels must be a non-empty object");
  }
  const endpoints = m.spec?.endpoints;
  if (!Array.isArray(endpoints) || endpoints.length === 0) errors.push("spec.endpoints must be a non-empty list");
  for (const [i, endpoint] of (Array.isArray(endpoints) ? endpoints : []).entries()) {
    if (typeof endpoint.port !== "string" || endpoint.port === "") errors.push(`spec.endpoints[${i}].port`);
    if (typeof endpoint.path !== "string" || !endpoint.path.startsWith("/")) errors.push(`spec.endpoints[${i}].path`);
    if (!/^[0-9]+(ms|s|m|h)$/.test(String(endpoint.interval))) errors.push(`spec.endpoints[${i}].interval`);
  }
  return errors;
}

/** Problems with one manifest; empty when it is valid. */
export async function kubernetesErrors(m: Manifest): Promise<string[]> {
  const id = `${m.kind}/${m.metadata?.name}`;
  if (typeof m.apiVersion !== "string" || typeof m.kind !== "string") return [`${id}: no apiVersion or kind`];
  if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(String(m.metadata?.name)) || String(m.metadata?.name).length > 63) {
    return [`${id}: metadata.name is not a DNS-1123 label of at most 63 characters`];
  }
  if (m.apiVersion === "monitoring.coreos.com/v1" && m.kind === "ServiceMonitor") {
    return serviceMonitorErrors(m).map((e) => `${id}: ${e}`);
  }
  const Model = await modelClass(m.apiVersion, m.kind);
  if (!Model) return [`${id}: no Kubernetes model for ${m.apiVersion} ${m.kind}`];
  try {
    new Model(m).validate();
    return [];
  } catch (error) {
    return [`${id}: ${error instanceof Error ? error.message : String(error)}`];
  }
}
