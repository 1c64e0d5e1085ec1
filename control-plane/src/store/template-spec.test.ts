import { describe, expect, it } from "vitest";
import { BuildSpecError, parseBuildSpec, parseStoredBuildSpec } from "./template-spec.js";

const key = JSON.stringify({ type: "service_account", project_id: "p", private_key_id: "k" });

describe("parseBuildSpec: registry credentials", () => {
  it("turns a GCP service account key into the `_json_key` login Google's registries take", () => {
    const spec = parseBuildSpec({
      fromImage: "europe-docker.pkg.dev/p/repo/app:1",
      fromImageRegistry: { type: "gcp", serviceAccountJson: key },
    });
    expect(spec.fromImageRegistry).toEqual({ type: "gcp", username: "_json_key", password: key });
  });

  it("refuses a GCP key that is not a JSON object, naming the field", () => {
    for (const serviceAccountJson of ["not json", "[1,2]", "42", 7]) {
      expect(() =>
        parseBuildSpec({ fromImage: "gcr.io/p/app", fromImageRegistry: { type: "gcp", serviceAccountJson } }),
      ).toThrow(BuildSpecError);
    }
    expect(() =>
      parseBuildSpec({ fromImage: "gcr.io/p/app", fromImageRegistry: { type: "gcp", serviceAccountJson: "{" } }),
    ).toThrow(/serviceAccountJson must be a service account key/);
  });

  it("reads back a stored spec, which keeps only the credentials' type", () => {
    const spec = parseBuildSpec({ fromImage: "gcr.io/p/app", fromImageRegistry: { type: "gcp" } });
    expect(spec.fromImageRegistry).toEqual({ type: "gcp" });
  });

  it("keeps a registry login as given and refuses unknown types", () => {
    const spec = parseBuildSpec({
      fromImage: "registry.example/app",
      fromImageRegistry: { type: "registry", username: "u", password: "p" },
    });
    expect(spec.fromImageRegistry).toEqual({ type: "registry", username: "u", password: "p" });
    expect(() => parseBuildSpec({ fromImage: "a", fromImageRegistry: { type: "azure" } })).toThrow(
      /must be registry, aws or gcp/,
    );
  });

  it("keeps AWS keys and region for the api's ECR login, and names what is missing or malformed", () => {
    const ref = "123456789012.dkr.ecr.eu-west-3.amazonaws.com/app:1";
    const given = { type: "aws", awsAccessKeyId: "AKIA1", awsSecretAccessKey: "s", awsRegion: "eu-west-3" };
    expect(parseBuildSpec({ fromImage: ref, fromImageRegistry: given }).fromImageRegistry).toEqual({
      type: "aws",
      aws: { accessKeyId: "AKIA1", secretAccessKey: "s", region: "eu-west-3" },
    });
    expect(parseBuildSpec({ fromImage: ref, fromImageRegistry: { type: "aws" } }).fromImageRegistry).toEqual({
      type: "aws",
    });
    expect(() => parseBuildSpec({ fromImage: ref, fromImageRegistry: { ...given, awsSecretAccessKey: "" } })).toThrow(
      /needs awsAccessKeyId and awsSecretAccessKey/,
    );
    for (const awsRegion of ["", "mars", "EU-WEST-3", "us-east-1; rm"]) {
      expect(() => parseBuildSpec({ fromImage: ref, fromImageRegistry: { ...given, awsRegion } })).toThrow(
        /awsRegion must be an AWS region such as us-east-1/,
      );
    }
    expect(
      parseBuildSpec({ fromImage: ref, fromImageRegistry: { ...given, awsRegion: "us-gov-west-1" } }).fromImageRegistry,
    ).toMatchObject({ aws: { region: "us-gov-west-1" } });
  });
});

describe("fromDebian: Warren's recipes only", () => {
  const debian = { suite: "bookworm", packages: ["tini"] };

  it("a stored spec keeps it", () => {
    expect(parseStoredBuildSpec({ fromDebian: debian, steps: [] }).fromDebian).toEqual(debian);
  });

  it("a request's is ignored, so the request names no base", () => {
    expect(() => parseBuildSpec({ fromDebian: debian, steps: [] })).toThrow(/one of fromImage or fromTemplate/);
    expect(parseBuildSpec({ fromDebian: debian, fromTemplate: "base" }).fromDebian).toBeUndefined();
  });

  it("goes with no other base, and its fields have their types", () => {
    expect(() => parseStoredBuildSpec({ fromDebian: debian, fromImage: "debian:bookworm" })).toThrow(BuildSpecError);
    expect(() => parseStoredBuildSpec({ fromDebian: { suite: 12 } })).toThrow(/fromDebian.suite/);
    expect(() => parseStoredBuildSpec({ fromDebian: { suite: "bookworm", packages: "tini" } })).toThrow(
      /fromDebian.packages/,
    );
  });
});
