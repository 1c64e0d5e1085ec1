import { BlockList } from "node:net";
import { describe, expect, it } from "vitest";
import {
  ALL_TRAFFIC,
  asksForEgress,
  CLOSED_EGRESS,
  compileEgress,
  domainPermitted,
  EgressPolicyError,
  effectiveEgress,
  OPEN_EGRESS,
  resolvedAddressPermitted,
  validateEgressPolicy,
} from "./policy.js";

describe("egress policy", () => {
  it("validates entries with E2B's messages", () => {
    expect(() => validateEgressPolicy({ allowOut: ["example.com"], denyOut: [] })).toThrow(
      "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.",
    );
    expect(() => validateEgressPolicy({ allowOut: [], denyOut: ["example.com"] })).toThrow(
      "network.denyOut entry 'example.com' is not an IP address or CIDR",
    );
    expect(() => validateEgressPolicy({ allowOut: ["10.0.0.0/33"], denyOut: [ALL_TRAFFIC] })).toThrow(
      EgressPolicyError,
    );
    expect(() => validateEgressPolicy({ allowOut: ["bad_name!"], denyOut: [ALL_TRAFFIC] })).toThrow(/allowOut entry/);
    expect(() => validateEgressPolicy({ allowOut: ["*.*.example.com"], denyOut: [ALL_TRAFFIC] })).toThrow();
    for (const ok of ["1.1.1.1", "10.0.0.0/8", "2001:db8::/32", "example.com", "*.Example.COM.", "a-b.c.io"]) {
      expect(() => validateEgressPolicy({ allowOut: [ok], denyOut: [ALL_TRAFFIC] })).not.toThrow();
    }
  });

  it("compiles to IPv4 CIDRs, domains and a default", () => {
    const c = compileEgress({
      allowOut: ["1.1.1.1", "*.Example.com", "api.test.io", "2001:db8::1"],
      denyOut: [ALL_TRAFFIC, "8.8.8.0/24"],
    });
    expect(c.allowCidrs).toEqual(["1.1.1.1/32"]);
    expect(c.denyCidrs).toEqual(["0.0.0.0/0", "8.8.8.0/24"]);
    expect(c.defaultAllow).toBe(false);
    expect(c.dns).toBe("domains");
    expect(compileEgress(OPEN_EGRESS)).toMatchObject({ defaultAllow: true, dns: "all" });
    expect(compileEgress(CLOSED_EGRESS)).toMatchObject({ defaultAllow: false, dns: "none" });
    // Same policy in another order: same key (the driver skips re-applying it).
    expect(compileEgress({ allowOut: ["api.test.io", "1.1.1.1"], denyOut: [ALL_TRAFFIC] }).key).toBe(
      compileEgress({ allowOut: ["1.1.1.1", "api.test.io", "1.1.1.1"], denyOut: [ALL_TRAFFIC] }).key,
    );
  });

  it("matches domains exactly and wildcards on subdomains only", () => {
    const c = compileEgress({ allowOut: ["*.example.com", "api.test.io"], denyOut: [ALL_TRAFFIC] });
    expect(domainPermitted(c, "a.example.com")).toBe(true);
    expect(domainPermitted(c, "A.B.Example.com.")).toBe(true);
    expect(domainPermitted(c, "example.com")).toBe(false);
    expect(domainPermitted(c, "badexample.com")).toBe(false);
    expect(domainPermitted(c, "api.test.io")).toBe(true);
    expect(domainPermitted(c, "x.api.test.io")).toBe(false);
  });

  it("never lets a permitted name lead to the floor, the node, or a private range not allowed by IP", () => {
    const node = new BlockList();
    node.addSubnet("10.201.0.0", 16, "ipv4");
    node.addAddress("192.0.2.10", "ipv4");
    const c = compileEgress({ allowOut: ["example.com", "10.9.0.0/16"], denyOut: [ALL_TRAFFIC] });
    expect(resolvedAddressPermitted(c, "198.18.1.10", node)).toBe(true);
    expect(resolvedAddressPermitted(c, "169.254.169.254", node)).toBe(false);
    expect(resolvedAddressPermitted(c, "127.0.0.1", node)).toBe(false);
    expect(resolvedAddressPermitted(c, "192.0.2.10", node)).toBe(false);
    expect(resolvedAddressPermitted(c, "10.201.0.6", node)).toBe(false);
    expect(resolvedAddressPermitted(c, "192.168.1.1", node)).toBe(false);
    expect(resolvedAddressPermitted(c, "10.9.3.4", node)).toBe(true);
    expect(resolvedAddressPermitted(c, "::1", node)).toBe(false);
  });

  it("folds allow_internet_access and the team's mode into the effective policy", () => {
    expect(effectiveEgress(null, undefined, "open")).toEqual(OPEN_EGRESS);
    expect(effectiveEgress(null, false, "open")).toEqual(CLOSED_EGRESS);
    expect(effectiveEgress({ denyOut: ["8.8.8.8"] }, true, "open")).toEqual({ allowOut: [], denyOut: ["8.8.8.8"] });
    expect(effectiveEgress(null, undefined, "closed")).toEqual(CLOSED_EGRESS);
    expect(effectiveEgress(null, true, "closed")).toEqual(OPEN_EGRESS);
    expect(effectiveEgress({ allowOut: ["1.1.1.1"] }, null, "closed")).toEqual({
      allowOut: ["1.1.1.1"],
      denyOut: [ALL_TRAFFIC],
    });
    expect(effectiveEgress({ allowOut: ["1.1.1.1"] }, true, "forbidden")).toEqual(CLOSED_EGRESS);
    expect(asksForEgress(null, undefined)).toBe(false);
    expect(asksForEgress({ allowOut: ["1.1.1.1"] }, undefined)).toBe(true);
    expect(asksForEgress(null, true)).toBe(true);
    expect(asksForEgress({ denyOut: [ALL_TRAFFIC] }, false)).toBe(false);
  });
});
