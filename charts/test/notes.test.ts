import { beforeAll, describe, expect, it } from "vitest";
import { ensureHelm } from "./helm.js";
import { kubernetesErrors } from "./kube-schema.js";
import {
  NAMESPACE,
  PROFILES,
  profileName,
  profileValues,
  RELEASE,
  render,
  renderNotes,
  workloads,
} from "./manifests.js";

beforeAll(async () => {
  await ensureHelm();
}, 600_000);

describe.each(PROFILES.map((p) => [profileName(p), p]))("NOTES.txt with %s", (_name, profile) => {
  let notes: string;
  beforeAll(async () => {
    notes = await renderNotes(profile);
  });

  it("tells how to get an API key, with the admin endpoint and with the admin CLI in an api pod", async () => {
    const manifests = await render(profile);
    const api = workloads(manifests).find((w) => w.metadata.name === `${RELEASE}-warren-api`);
    expect(api).toBeDefined();
    expect(notes).toContain(
      `kubectl -n ${NAMESPACE} exec deploy/${RELEASE}-warren-api -- node control-plane/dist/api/admin-cli.js create-team`,
    );
    expect(notes).toContain("POST http://127.0.0.1:8080/warren/v1/admin/teams");
    expect(notes).toContain('-H "X-Admin-Token: $ADMIN_TOKEN"');
    const secrets =
      (profileValues(profile).secrets as { existingSecret?: string }).existingSecret || `${RELEASE}-warren-secrets`;
    expect(notes).toContain(`get secret ${secrets} -o jsonpath='{.data.adminToken}'`);
    expect(notes).not.toMatch(/<no value>|%!/);
  });

  it("tells how to point the e2b SDK at the cluster", () => {
    const values = profileValues(profile);
    const ingress = values.ingress as { enabled: boolean; tls: { enabled: boolean } };
    expect(notes).toContain("export E2B_API_KEY=");
    if (values.domain && ingress.enabled) {
      expect(notes).toContain(`export E2B_DOMAIN=${values.domain}`);
      if (!ingress.tls.enabled) expect(notes).toContain("E2B_SANDBOX_URL");
    } else {
      expect(notes).toContain("export E2B_API_URL=");
      expect(notes).toContain("export E2B_SANDBOX_URL=");
    }
  });
});

describe("NOTES.txt warnings", () => {
  it("warns when Redis admits no sandbox-node traffic under the NetworkPolicy", async () => {
    expect(await renderNotes(undefined)).toContain("networkPolicy.sandboxNodeCIDRs is empty");
    expect(await renderNotes("ci/tls-cert-manager-values.yaml")).not.toContain("sandboxNodeCIDRs is empty");
  });

  it("warns that a pod-network proxy without the relay needs routes to the sandboxes", async () => {
    const relayOff = ["proxy.relay.mode=off"];
    expect(await renderNotes("ci/no-ingress-values.yaml", relayOff)).toContain("proxy.kind is Deployment");
    expect(await renderNotes("ci/no-ingress-values.yaml")).not.toContain("proxy.kind is Deployment");
    expect(await renderNotes(undefined, relayOff)).not.toContain("proxy.kind is Deployment");
  });
});

describe("the Kubernetes schema check", () => {
  it("rejects manifests that break the API schemas", async () => {
    const deployment = {
      apiVersion: "apps/v1",
      kind: "Deployment",
      metadata: { name: "broken" },
      spec: { selector: { matchLabels: { a: "b" } }, template: { spec: { containers: [{ image: "x" }] } } },
    };
    expect((await kubernetesErrors(deployment)).join()).toMatch(/name/);
    const service = { apiVersion: "v1", kind: "Service", metadata: { name: "s" }, spec: { ports: [{ port: "http" }] } };
    expect(await kubernetesErrors(service)).not.toEqual([]);
    expect(
      await kubernetesErrors({ apiVersion: "example.com/v1", kind: "Widget", metadata: { name: "w" } }),
    ).not.toEqual([]);
    expect(await kubernetesErrors({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "Bad_Name" } })).not.toEqual(
      [],
    );
    expect(await kubernetesErrors({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "good" } })).toEqual([]);
  });
});
