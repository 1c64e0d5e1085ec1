import { describe, expect, it } from "vitest";
import { DebianSourceError, mirrorForLog, normalizeDebianSource } from "./debian-rootfs.js";

describe("normalizeDebianSource", () => {
  it("sorts the packages and drops repeats: the same set is the same base", () => {
    expect(normalizeDebianSource({ suite: "bookworm", packages: ["tini", "procps", "tini", "g++-12"] })).toEqual({
      suite: "bookworm",
      packages: ["g++-12", "procps", "tini"],
    });
  });

  it("refuses what is not a Debian name before debootstrap sees it", () => {
    for (const bad of ["--foreign", "Tini", "a", "x;rm", "../etc", ""]) {
      expect(() => normalizeDebianSource({ suite: "bookworm", packages: [bad] })).toThrow(DebianSourceError);
    }
    for (const suite of ["--variant=buildd", "Bookworm", "bookworm/updates", ""]) {
      expect(() => normalizeDebianSource({ suite, packages: [] })).toThrow(/is not a Debian suite name/);
    }
    expect(() => normalizeDebianSource({ suite: "bookworm", packages: Array(513).fill("tini") })).toThrow(
      /at most 512 packages/,
    );
  });
});

describe("normalizeDebianSource: packages apt installs after debootstrap", () => {
  it("are checked and sorted the same way, and left out when there are none", () => {
    expect(
      normalizeDebianSource({ suite: "bookworm", packages: ["tini"], aptPackages: ["r-base-core", "python3-zmq"] }),
    ).toEqual({
      suite: "bookworm",
      packages: ["tini"],
      aptPackages: ["python3-zmq", "r-base-core"],
    });
    expect(normalizeDebianSource({ suite: "bookworm", packages: ["tini"], aptPackages: [] })).toEqual({
      suite: "bookworm",
      packages: ["tini"],
    });
    expect(() => normalizeDebianSource({ suite: "bookworm", packages: [], aptPackages: ["-o=Dir::Etc=/x"] })).toThrow(
      DebianSourceError,
    );
  });
});

describe("mirrorForLog", () => {
  it("leaves a private mirror's user and password out, and the rest as it is", () => {
    expect(mirrorForLog("http://deb.debian.org/debian")).toBe("http://deb.debian.org/debian");
    expect(mirrorForLog("https://me:s3cret@mirror.example.org/debian")).toBe("https://mirror.example.org/debian");
    expect(mirrorForLog("https://me:s3cret@mirror.example.org/debian")).not.toContain("s3cret");
  });
});
