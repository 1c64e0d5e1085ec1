import { describe, expect, it } from "vitest";
import {
  commandLines,
  type ExecPolicy,
  ExecPolicyError,
  evaluateExecPolicy,
  normalizePath,
  parseExecPolicy,
  policyGuardsFiles,
  wildcardMatch,
} from "./exec-policy.js";

describe("wildcardMatch", () => {
  it("matches whole strings with * and ?", () => {
    expect(wildcardMatch("rm -rf *", "rm -rf /tmp/x")).toBe(true);
    expect(wildcardMatch("rm -rf *", "echo rm -rf /")).toBe(false);
    expect(wildcardMatch("*curl *", "echo a && curl http://x")).toBe(true);
    expect(wildcardMatch("l?", "ls")).toBe(true);
    expect(wildcardMatch("l?", "lsx")).toBe(false);
    expect(wildcardMatch("*", "")).toBe(true);
    expect(wildcardMatch("a*b*c", "aXbYc")).toBe(true);
    expect(wildcardMatch("a*b*c", "aXbY")).toBe(false);
  });

  it("stays linear on patterns built to backtrack", () => {
    const text = "a".repeat(20_000);
    const started = performance.now();
    expect(wildcardMatch(`${"*a".repeat(50)}b`, text)).toBe(false);
    // Not a timing assertion on the feature: a guard that the matcher is not exponential (it would never return).
    expect(performance.now() - started).toBeLessThan(30_000);
  });
});

describe("commandLines", () => {
  it("takes the script of a shell's -c and the whole argv", () => {
    expect(commandLines("/bin/bash", ["-l", "-c", "rm -rf /x"])).toEqual(["rm -rf /x", "/bin/bash -l -c rm -rf /x"]);
    expect(commandLines("/usr/bin/rm", ["-rf", "/x"])).toEqual(["/usr/bin/rm -rf /x"]);
    expect(commandLines("sh", ["-lc", "id"])).toEqual(["id", "sh -lc id"]);
  });
});

describe("parseExecPolicy", () => {
  it("accepts command, root and path rules", () => {
    const policy = parseExecPolicy({
      rules: [
        { name: "no curl", command: "curl *", action: "deny" },
        { asRoot: true, action: "review" },
        { paths: ["/etc/../etc/", "/home/user/keep"], ops: ["remove"], action: "review" },
      ],
      default: "allow",
      reviewTtlSeconds: 60,
    });
    expect(policy.rules[2]?.paths).toEqual(["/etc", "/home/user/keep"]);
  });

  it.each([
    [{}, "rules"],
    [{ rules: [{ action: "maybe", command: "x" }] }, "rules[0].action"],
    [{ rules: [{ action: "deny" }] }, "rules[0]"],
    [{ rules: [{ action: "deny", command: "x", paths: ["/a"] }] }, "rules[0]"],
    [{ rules: [{ action: "deny", paths: ["relative"] }] }, "rules[0].paths[0]"],
    [{ rules: [{ action: "deny", paths: ["/a"], ops: ["chmod"] }] }, "rules[0].ops[0]"],
    [{ rules: [{ action: "deny", command: "x", colour: "red" }] }, "rules[0].colour"],
    [{ rules: [], reviewTtlSeconds: 0 }, "reviewTtlSeconds"],
    [{ rules: [], extra: 1 }, "extra"],
  ])("rejects %j naming %s", (raw, field) => {
    try {
      parseExecPolicy(raw);
      expect.unreachable();
    } catch (error) {
      expect(error).toBeInstanceOf(ExecPolicyError);
      expect((error as ExecPolicyError).field).toBe(field);
    }
  });
});

describe("evaluateExecPolicy", () => {
  const policy: ExecPolicy = parseExecPolicy({
    rules: [
      { name: "no curl", command: "curl *", action: "deny" },
      { command: "rm -rf *", action: "review" },
      { asRoot: true, action: "review" },
      { paths: ["/etc"], action: "deny" },
      { paths: ["/home/user/keep"], ops: ["remove"], action: "review" },
    ],
  });
  const start = (script: string, user = "user") =>
    ({ kind: "start", cmd: "/bin/bash", args: ["-l", "-c", script], user }) as const;

  it("takes the first rule that matches, else the default", () => {
    expect(evaluateExecPolicy(policy, start("curl http://x"))).toMatchObject({ action: "deny", ruleName: "no curl" });
    expect(evaluateExecPolicy(policy, start("rm -rf /tmp/x"))).toMatchObject({ action: "review", ruleName: "rule 2" });
    expect(evaluateExecPolicy(policy, start("id", "root"))).toMatchObject({ action: "review", ruleName: "rule 3" });
    expect(evaluateExecPolicy(policy, start("echo hi"))).toMatchObject({ action: "allow", ruleName: "default" });
  });

  it("matches file operations on a path and under it, after normalising", () => {
    expect(evaluateExecPolicy(policy, { kind: "write", path: "/etc/hosts" }).action).toBe("deny");
    expect(evaluateExecPolicy(policy, { kind: "write", path: "/tmp/../etc/x" }).action).toBe("deny");
    expect(evaluateExecPolicy(policy, { kind: "write", path: "/etcetera" }).action).toBe("allow");
    expect(evaluateExecPolicy(policy, { kind: "remove", path: "/home/user/keep" }).action).toBe("review");
    expect(evaluateExecPolicy(policy, { kind: "write", path: "/home/user/keep/a" }).action).toBe("allow");
    expect(policyGuardsFiles(policy)).toBe(true);
    expect(policyGuardsFiles(parseExecPolicy({ rules: [{ command: "x", action: "deny" }] }))).toBe(false);
  });

  it("normalises paths without going above /", () => {
    expect(normalizePath("/../../a//b/./c/..")).toBe("/a/b");
  });
});
