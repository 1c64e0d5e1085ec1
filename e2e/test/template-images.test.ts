import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import type { ManagedChild } from "@warren/local/services";
import { Sandbox, Template } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type EcrStandIn, startEcrStandIn } from "../src/ecr-stand-in.js";
import { pushBusyboxImage, startRegistry } from "../src/registry.js";

// Templates `fromImage`: an image the test makes (busybox, no glibc) pushed to registries on loopback (Debian's
// docker-registry, one of them behind htpasswd), pulled by the node agent without Docker (skopeo, umoci), prepared
// for envd and kept as the template's bottom layer; then steps on top, through the official SDK.
const dataDir = mkdtempSync(join(tmpdir(), "warren-timg-"));
const login = { username: "builder", password: "s3cret-pass" };
// A service account key as fromGCPRegistry sends it (JSON text); Google's registries take it as the password of
// the user `_json_key`, and so does the test's registry.
const gcpKey = {
  type: "service_account",
  private_key_id: "5f2c0d7e",
  project_id: "warren-tests",
  client_email: "builder@warren-tests.example",
};
let open: { host: string; process: ManagedChild };
let locked: { host: string; process: ManagedChild };
let gcp: { host: string; process: ManagedChild };
// fromAWSRegistry: keys exchanged for an ECR login at the trigger (ECR's GetAuthorizationToken, here a loopback
// stand-in checking the SigV4 signature); the registry takes that login, as ECR's registries do.
const awsKeys = {
  accessKeyId: "AKIAWARRENTEST000001",
  secretAccessKey: "wJalrXUtnFEMI/K7MDENG/warren-test-key",
  region: "eu-west-3",
};
const ecrLoginGiven = { username: "AWS", password: "ecr-token-1f9a7c" };
let ecrRegistry: { host: string; process: ManagedChild };
let ecr: EcrStandIn;
let cluster: LocalCluster;
const created: Sandbox[] = [];

beforeAll(async () => {
  open = await startRegistry(join(dataDir, "open"));
  locked = await startRegistry(join(dataDir, "locked"), login);
  gcp = await startRegistry(join(dataDir, "gcp"), { username: "_json_key", password: JSON.stringify(gcpKey) });
  ecrRegistry = await startRegistry(join(dataDir, "ecr"), ecrLoginGiven);
  ecr = await startEcrStandIn({ ...awsKeys, login: ecrLoginGiven });
  await pushBusyboxImage(join(dataDir, "img-ecr"), `${ecrRegistry.host}/team/busybox:1`, ecrLoginGiven);
  await pushBusyboxImage(join(dataDir, "img-open"), `${open.host}/tests/busybox:1`);
  await pushBusyboxImage(join(dataDir, "img-locked"), `${locked.host}/private/busybox:1`, login);
  await pushBusyboxImage(join(dataDir, "img-gcp"), `${gcp.host}/warren-tests/busybox:1`, {
    username: "_json_key",
    password: JSON.stringify(gcpKey),
  });
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 0,
    instancePrefix: "v",
    nodeCidr: () => "10.230.0.0/22",
    env: {
      WARREN_INSECURE_REGISTRIES: `${open.host},${locked.host},${gcp.host},${ecrRegistry.host}`,
      WARREN_ECR_ENDPOINT: ecr.url,
    },
  });
  const env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await cluster?.stop();
  await open?.process.stop();
  await locked?.process.stop();
  await gcp?.process.stop();
  await ecrRegistry?.process.stop();
  await ecr?.close();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

const run = async (sbx: Sandbox, cmd: string) => (await sbx.commands.run(cmd)).stdout.trim();

describe("templates from OCI images", () => {
  it("builds from an image in a registry: its files, its config's environment, steps on top, E2B's user", async () => {
    const logs: string[] = [];
    await Template.build(
      Template()
        .fromImage(`${open.host}/tests/busybox:1`)
        .runCmd("echo layered > /etc/layered", { user: "root" })
        .runCmd("echo $IMAGE_VAR > /tmp/seen-at-build"),
      "from-image",
      { onBuildLogs: (e) => logs.push(e.message) },
    );
    expect(logs.some((l) => l.includes(`pulling ${open.host}/tests/busybox:1`))).toBe(true);
    const sbx = await Sandbox.create("from-image", { timeoutMs: 120_000 });
    created.push(sbx);
    expect(await run(sbx, "cat /etc/greeting")).toBe("hello from the image");
    expect(await run(sbx, "cat /etc/layered")).toBe("layered");
    expect(await run(sbx, "cat /tmp/seen-at-build")).toBe("from-the-config");
    expect(await run(sbx, "id -un")).toBe("user");
    // The image's own node is the sandbox's; envd runs on the host's, bound at a path of Warren's own.
    expect(await run(sbx, "/usr/local/bin/node --version")).toBe("the image's own node --version");

    // A rebuild reuses the pulled image (the reference is its cache key, as on E2B).
    const again: string[] = [];
    await Template.build(
      Template().fromImage(`${open.host}/tests/busybox:1`).runCmd("echo layered > /etc/layered", { user: "root" }),
      "from-image-2",
      { onBuildLogs: (e) => again.push(e.message) },
    );
    expect(again.some((l) => l.startsWith("CACHED [base]"))).toBe(true);
  }, 240_000);

  it("pulls from a private registry with the credentials the SDK sends, and names refused ones", async () => {
    const ref = `${locked.host}/private/busybox:1`;
    await Template.build(Template().fromImage(ref, login).runCmd("true"), "from-private");
    const sbx = await Sandbox.create("from-private", { timeoutMs: 120_000 });
    created.push(sbx);
    expect(await run(sbx, "cat /etc/greeting")).toBe("hello from the image");
    const refused = await Template.build(
      Template().fromImage(ref, { username: login.username, password: "wrong" }).runCmd("true"),
      "refused",
      // The pulled image is cached under its reference: skipCache makes the build pull (and log in) again.
      { skipCache: true },
    ).catch((e: unknown) => e as Error);
    expect((refused as Error).message).toMatch(/unauthorized/);
    const anonymous = await Template.build(Template().fromImage(ref).runCmd("true"), "anonymous", {
      skipCache: true,
    }).catch((e: unknown) => e as Error);
    expect((anonymous as Error).message).toMatch(/unauthorized/);
  }, 240_000);

  it("pulls with a GCP service account key (fromGCPRegistry: the key is the password of `_json_key`), and refuses another key", async () => {
    const ref = `${gcp.host}/warren-tests/busybox:1`;
    await Template.build(Template().fromGCPRegistry(ref, { serviceAccountJSON: gcpKey }).runCmd("true"), "from-gcp");
    const sbx = await Sandbox.create("from-gcp", { timeoutMs: 120_000 });
    created.push(sbx);
    expect(await run(sbx, "cat /etc/greeting")).toBe("hello from the image");
    const otherKey = { ...gcpKey, private_key_id: "9a01b3c4" };
    const refused = await Template.build(
      Template().fromGCPRegistry(ref, { serviceAccountJSON: otherKey }).runCmd("true"),
      "gcp-refused",
      { skipCache: true },
    ).catch((e: unknown) => e as Error);
    expect((refused as Error).message).toMatch(/unauthorized/);
  }, 240_000);

  it("pulls with AWS keys (fromAWSRegistry: exchanged for an ECR login), and refuses keys ECR refuses at the trigger", async () => {
    const ref = `${ecrRegistry.host}/team/busybox:1`;
    await Template.build(Template().fromAWSRegistry(ref, awsKeys).runCmd("true"), "from-ecr");
    expect(ecr.logins).toBe(1);
    const sbx = await Sandbox.create("from-ecr", { timeoutMs: 120_000 });
    created.push(sbx);
    expect(await run(sbx, "cat /etc/greeting")).toBe("hello from the image");
    // Keys ECR refuses fail the build at its trigger, before anything is stored or pulled.
    const refused = (keys: typeof awsKeys, name: string) =>
      Template.build(Template().fromAWSRegistry(ref, keys).runCmd("true"), name, { skipCache: true }).catch(
        (e: unknown) => e as Error,
      );
    const badSecret = await refused({ ...awsKeys, secretAccessKey: "not-the-secret" }, "ecr-refused");
    expect((badSecret as Error).message).toMatch(/ECR \(eu-west-3\) refused the AWS keys: InvalidSignatureException/);
    expect((badSecret as Error).message).not.toContain("not-the-secret");
    const unknownKey = await refused({ ...awsKeys, accessKeyId: "AKIAUNKNOWN000000000" }, "ecr-unknown");
    expect((unknownKey as Error).message).toMatch(/UnrecognizedClientException/);
    const badRegion = await refused({ ...awsKeys, region: "mars" }, "ecr-region");
    expect((badRegion as Error).message).toMatch(/awsRegion must be an AWS region such as us-east-1, got 'mars'/);
    expect(ecr.logins).toBe(1);
  }, 240_000);

  it("fails a build from a missing image with a clear reason at the base step", async () => {
    const error = await Template.build(
      Template().fromImage(`${open.host}/tests/nothing-here:9`).runCmd("true"),
      "missing-image",
    ).catch((e: unknown) => e as Error);
    expect((error as Error).message).toMatch(/not found/);
  }, 240_000);
});
