import { CoordinationV1Api, CoreV1Api, KubeConfig } from "@kubernetes/client-node";
import type { KubernetesConfig } from "../config.js";

/** The Kubernetes API clients the master uses, from one KubeConfig. */
export interface KubernetesApi {
  readonly kubeConfig: KubeConfig;
  readonly core: CoreV1Api;
  readonly coordination: CoordinationV1Api;
}

/**
 * `in-cluster`: the pod's service account (KUBERNETES_SERVICE_HOST/PORT, token and CA under
 * /var/run/secrets/kubernetes.io/serviceaccount; the token file is re-read as the kubelet rotates it).
 * `kubeconfig`: KUBECONFIG, else ~/.kube/config, its current context.
 */
export function connectKubernetes(config: Pick<KubernetesConfig, "mode">): KubernetesApi {
  const kubeConfig = new KubeConfig();
  if (config.mode === "in-cluster") {
    if (!process.env.KUBERNETES_SERVICE_HOST) {
      throw new Error("WARREN_KUBERNETES=in-cluster but KUBERNETES_SERVICE_HOST is not set: not running in a pod?");
    }
    kubeConfig.loadFromCluster();
  } else {
    kubeConfig.loadFromDefault();
  }
  if (!kubeConfig.getCurrentCluster()) throw new Error(`WARREN_KUBERNETES=${config.mode}: no cluster configured`);
  return {
    kubeConfig,
    core: kubeConfig.makeApiClient(CoreV1Api),
    coordination: kubeConfig.makeApiClient(CoordinationV1Api),
  };
}

/** The HTTP status of a failed API call (ApiException.code, or a watch error's statusCode). */
export function statusOf(error: unknown): number | undefined {
  if (error && typeof error === "object") {
    const { code, statusCode } = error as { code?: unknown; statusCode?: unknown };
    if (typeof code === "number") return code;
    if (typeof statusCode === "number") return statusCode;
  }
  return undefined;
}

/** A short description of an API error for logs (ApiException messages carry whole response bodies). */
export function describeError(error: unknown): string {
  const status = statusOf(error);
  const body = (error as { body?: { message?: unknown } } | undefined)?.body;
  const message = typeof body?.message === "string" ? body.message : error instanceof Error ? error.message : "";
  return status ? `HTTP ${status}: ${message.split("\n")[0]}` : message.split("\n")[0] || String(error);
}

/** Rejects when `promise` has not settled within `ms` (the request itself may still finish later). */
export function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
