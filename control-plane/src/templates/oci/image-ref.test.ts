import { describe, expect, it } from "vitest";
import { formatImageRef, parseImageRef, registryHost } from "./image-ref.js";

const DIGEST = `sha256:${"ab".repeat(32)}`;

describe("image references are read as Docker reads them", () => {
  it.each([
    ["ubuntu", "docker.io/library/ubuntu:latest"],
    ["ubuntu:22.04", "docker.io/library/ubuntu:22.04"],
    ["library/debian:stable", "docker.io/library/debian:stable"],
    ["e2bdev/code-interpreter:latest", "docker.io/e2bdev/code-interpreter:latest"],
    ["docker.io/python:3.12-slim", "docker.io/library/python:3.12-slim"],
    ["index.docker.io/library/node:20", "docker.io/library/node:20"],
    ["127.0.0.1:5000/team/img:v1", "127.0.0.1:5000/team/img:v1"],
    ["localhost/img", "localhost/img:latest"],
    ["localhost:5000/img", "localhost:5000/img:latest"],
    ["ghcr.io/org/sub/img", "ghcr.io/org/sub/img:latest"],
    ["[::1]:5000/img:t", "[::1]:5000/img:t"],
    ["Registry/img", "Registry/img:latest"],
    [`img@${DIGEST}`, `docker.io/library/img@${DIGEST}`],
    [`127.0.0.1:5000/a/b:v2@${DIGEST}`, `127.0.0.1:5000/a/b:v2@${DIGEST}`],
    ["team/a.b-c_d__e/f---g:T_1.x-y", "docker.io/team/a.b-c_d__e/f---g:T_1.x-y"],
  ])("%s → %s", (ref, canonical) => {
    expect(formatImageRef(parseImageRef(ref))).toBe(canonical);
  });

  it("a digest is what gets pulled; a tag next to it only documents", () => {
    expect(parseImageRef(`ubuntu:22.04@${DIGEST}`)).toEqual({
      registry: "docker.io",
      repository: "library/ubuntu",
      tag: "22.04",
      digest: DIGEST,
    });
    expect(parseImageRef(`ubuntu@${DIGEST}`).tag).toBeUndefined();
  });

  it.each([
    ["", "empty"],
    [" ubuntu", "whitespace"],
    ["ubuntu 22.04", "whitespace"],
    ["docker://ubuntu", "scheme"],
    ["Ubuntu", "lower-case"],
    ["team/Img", "lower-case"],
    ["ubuntu:", "tag ''"],
    ["ubuntu:-x", "tag '-x'"],
    [`ubuntu:${"x".repeat(129)}`, "tag"],
    ["ubuntu@sha256:abc", "digest"],
    [`ubuntu@md5:${"a".repeat(32)}`, "digest"],
    ["team//img", "repository path component"],
    ["team/img_", "'img_'"],
    ["-bad.io/img", "registry"],
    [":5000/img", "registry"],
    ["127.0.0.1:5000/", "repository path component"],
    [`r.io/${"a".repeat(260)}`, "longer than 255"],
  ])("'%s' is an invalid_ref naming the problem (%s)", (ref, why) => {
    let error: unknown;
    try {
      parseImageRef(ref);
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ name: "ImageError", code: "invalid_ref" });
    expect((error as Error).message).toContain(`'${ref}'`);
    expect((error as Error).message).toContain(why);
  });

  it("Docker Hub names go to the mirror when one is configured, other registries never do", () => {
    expect(registryHost(parseImageRef("ubuntu"), "127.0.0.1:5001")).toBe("127.0.0.1:5001");
    expect(registryHost(parseImageRef("ubuntu"), undefined)).toBe("docker.io");
    expect(registryHost(parseImageRef("ghcr.io/a/b"), "127.0.0.1:5001")).toBe("ghcr.io");
  });
});
