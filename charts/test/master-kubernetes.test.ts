/**
 * The chart against the master's Kubernetes integration: the RBAC it renders is exactly what the master calls
 * (KUBERNETES_ACCESS, the same list the master's tests check its requests against), and the environment it
 * renders turns the integration on with a selector, port and Lease that match the chart's own objects.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { loadMasterConfig } from "../../control-plane/src/master/config.js";
import { KUBERNETES_ACCESS } from "../../control-plane/src/master/kubernetes/access.js";
import { ensureHelm } from "./helm.js";
import {
  componentContainer,
  containerEnv,
  get,
  type Manifest,
  NAMESPACE,
  PROFILES,
  profileName,
  RELEASE,
  render,
  workloads,
} from "./manifests.js";

const MASTER = `${RELEASE}-warren-master`;
const rendered = new Map<string, Manifest[]>();

beforeAll(async () => {
  await ensureHelm();
  for (const profile of PROFILES) rendered.set(profileName(profile), await render(profile));
  rendered.set("kubernetesApi off", await render(undefined, ["master.kubernetesApi.enabled=false"]));
  rendered.set("no node agents", await render(undefined, ["nodeAgent.enabled=false"]));
}, 600_000);

function manifests(name: string): Manifest[] {
  return rendered.get(name) as Manifest[];
}

function masterConfig(m: Manifest[]) {
  return loadMasterConfig(containerEnv(m, componentContainer(m, "master")));
}

/** RBAC rules as comparable strings: scope, group, resource, verb, and the one name when limited to it. */
function grants(m: Manifest[]): string[] {
  const out: string[] = [];
  for (const role of m.filter((x) => x.kind === "Role" || x.kind === "ClusterRole")) {
    const scope = role.kind === "Role" ? "namespace" : "cluster";
    for (const rule of role.rules) {
      for (const group of rule.apiGroups)
        for (const resource of rule.resources)
          for (const verb of rule.verbs)
            out.push([scope, group, resource, verb, ...(rule.resourceNames ?? [])].join(" "));
    }
  }
  return out.sort();
}

function matchesSelector(selector: string, labels: Record<string, string>): boolean {
  return selector.split(",").every((term) => {
    const [key, value] = term.split("=") as [string, string];
    return labels[key] === value;
  });
}

describe.each(PROFILES.map((p) => [profileName(p)]))("master Kubernetes integration, %s", (name) => {
  it("grants the master exactly the calls it makes, its Lease by name", () => {
    const m = manifests(name);
    const config = masterConfig(m);
    expect(config.kubernetes?.mode).toBe("in-cluster");
    const lease = config.kubernetes?.leaseName as string;
    expect(lease).toBe(MASTER);
    const expected = KUBERNETES_ACCESS.flatMap((rule) =>
      rule.verbs.map((verb) =>
        [rule.scope, rule.apiGroup, rule.resource, verb, ...(rule.onlyTheLease ? [lease] : [])].join(" "),
      ),
    ).sort();
    expect(grants(m)).toEqual(expected);
    for (const binding of m.filter((x) => x.kind === "RoleBinding" || x.kind === "ClusterRoleBinding")) {
      expect(binding.subjects).toEqual([{ kind: "ServiceAccount", name: MASTER, namespace: NAMESPACE }]);
    }
    const master = workloads(m).find((w) => w.metadata.name === MASTER) as Manifest;
    expect(master.spec.template.spec.serviceAccountName).toBe(MASTER);
    expect(master.spec.template.spec.automountServiceAccountToken).toBe(true);
    for (const other of workloads(m).filter((w) => w !== master)) {
      expect(other.spec.template.spec.automountServiceAccountToken, other.metadata.name).not.toBe(true);
    }
  });

  it("finds the chart's node agent pods, and only them, at their `connect` port; namespace and identity from the pod", () => {
    const m = manifests(name);
    const k8s = masterConfig(m).kubernetes;
    expect(k8s?.namespace).toBe(NAMESPACE);
    expect(k8s?.identity).toMatch(new RegExp(`^${MASTER}-`));
    const agents = get(m, "DaemonSet", `${RELEASE}-warren-node-agent`);
    const selected = workloads(m).filter((w) =>
      matchesSelector(k8s?.agentSelector as string, w.spec.template.metadata.labels),
    );
    expect(selected).toEqual([agents]);
    const ports = agents.spec.template.spec.containers[0].ports.map((p: Manifest) => p.name);
    expect(ports).toContain(k8s?.agentPort);
    expect(k8s?.leaseSeconds).toBeGreaterThanOrEqual((3 * masterConfig(m).leaderIntervalMs) / 1000);
  });
});

describe.each([["kubernetesApi off"], ["no node agents"]])("master Kubernetes integration, %s", (name) => {
  it("is off: no token, no Role, the PostgreSQL lock and Redis heartbeats as without Kubernetes", () => {
    const m = manifests(name);
    expect(masterConfig(m).kubernetes).toBeUndefined();
    expect(m.filter((x) => /Role/.test(x.kind))).toEqual([]);
    for (const w of workloads(m)) expect(w.spec.template.spec.automountServiceAccountToken).not.toBe(true);
    const env = containerEnv(m, componentContainer(m, "master"));
    expect(env.WARREN_KUBERNETES).toBe("off");
  });
});
