import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { choosePlatform, describeManifest, hostPlatform, manifestDigest } from "./manifest.js";

const d = (c: string) => `sha256:${c.repeat(64)}`;
const [os, arch] = hostPlatform().split("/");
const other = arch === "amd64" ? "arm64" : "amd64";

describe("manifests and manifest lists", () => {
  it("a list resolves to this host's platform, skipping BuildKit's attestation entries", () => {
    const list = JSON.stringify({
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [
        { digest: d("a"), platform: { os, architecture: other } },
        { digest: d("b"), platform: { os: "unknown", architecture: "unknown" } },
        { digest: d("c"), platform: { os, architecture: arch } },
      ],
    });
    expect(choosePlatform(list, "img")).toEqual({ digest: d("c") });
  });

  it("a list without this platform is unsupported and says what it has", () => {
    const list = JSON.stringify({
      manifests: [
        { digest: d("a"), platform: { os: "linux", architecture: other } },
        { digest: d("b"), platform: { os: "unknown", architecture: "unknown" } },
      ],
    });
    expect(() => choosePlatform(list, "team/img:v1")).toThrow(
      expect.objectContaining({
        code: "unsupported",
        message: `image 'team/img:v1' has no ${hostPlatform()} variant (it has: linux/${other})`,
      }),
    );
  });

  it("a single image's manifest: digest of its bytes, size of config and layers, zstd noticed", () => {
    const raw = JSON.stringify({
      schemaVersion: 2,
      config: { digest: d("c"), size: 10 },
      layers: [
        { mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", size: 100 },
        { mediaType: "application/vnd.oci.image.layer.v1.tar+zstd", size: 1000 },
      ],
    });
    expect(choosePlatform(raw, "img")).toBeUndefined();
    expect(describeManifest(raw, "img")).toEqual({
      digest: `sha256:${createHash("sha256").update(raw).digest("hex")}`,
      bytes: 1110,
      layers: 2,
      zstd: true,
    });
    expect(manifestDigest(raw)).toBe(describeManifest(raw, "img").digest);
  });

  it("garbage from a registry is a failed pull, not a crash", () => {
    expect(() => describeManifest("<html>", "img")).toThrow(expect.objectContaining({ code: "failed" }));
    expect(() => describeManifest("{}", "img")).toThrow(expect.objectContaining({ code: "failed" }));
  });
});
