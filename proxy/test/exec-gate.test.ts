import { randomBytes } from "node:crypto";
import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { EXEC_POLICIES_SYNCED_KEY, type ExecPolicy, execPolicyKey, parseExecPolicy } from "@warren/proto/exec-policy";
import { StartRequestSchema } from "@warren/proto/process/process_pb";
import type { SandboxRoute } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import {
  basicUser,
  type ExecDecider,
  ExecGate,
  ExecGateError,
  type GateDecision,
  RedisPolicySource,
  resolvePath,
} from "../src/exec-gate.js";

// The gate against a fixed policy and a recording decider: the seams are Warren's own (the real Redis mirror and the
// api's decisions run in e2e/test/exec-policy.test.ts).
const route = { sandboxId: "sbx1", team: "team_a", defaultUser: "user" } as SandboxRoute;

class Recorder implements ExecDecider {
  readonly denials: GateDecision[] = [];
  readonly reviews: (GateDecision & { digest: string })[] = [];
  readonly redeemed: { approvalId: string; digest: string }[] = [];
  async recordDenial(decision: GateDecision) {
    this.denials.push(decision);
  }
  async openReview(decision: GateDecision & { digest: string; ttlSeconds: number }) {
    this.reviews.push(decision);
    return { approvalId: "apr_00000000000000000001" };
  }
  async redeem(_sandboxId: string, approvalId: string, digest: string) {
    this.redeemed.push({ approvalId, digest });
  }
}

function gate(policy: ExecPolicy | undefined) {
  const decider = new Recorder();
  return { decider, gate: new ExecGate({ policyOf: async () => policy }, decider) };
}

const policy = parseExecPolicy({
  rules: [
    { name: "no curl", command: "curl *", action: "deny" },
    { name: "destructive", command: "rm -rf *", action: "review" },
    { paths: ["/etc"], action: "deny" },
  ],
});

function startBody(codec: "json" | "proto", script: string, envs: Record<string, string> = {}): Buffer {
  const message = create(StartRequestSchema, {
    process: { cmd: "/bin/bash", args: ["-l", "-c", script], envs, cwd: "/tmp" },
    stdin: false,
  });
  const payload =
    codec === "json"
      ? Buffer.from(JSON.stringify(toJson(StartRequestSchema, message)))
      : Buffer.from(toBinary(StartRequestSchema, message));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

const type = { json: "application/connect+json", proto: "application/connect+proto" } as const;

describe("ExecGate.checkStart", () => {
  it("forwards a start untouched when the team has no policy", async () => {
    const { gate: g } = gate(undefined);
    const body = startBody("json", "rm -rf /");
    expect(await g.checkStart(route, {}, type.json, body)).toBe(body);
  });

  it.each(["json", "proto"] as const)("denies, reviews and redeems in the %s codec", async (codec) => {
    const { gate: g, decider } = gate(policy);
    await expect(g.checkStart(route, {}, type[codec], startBody(codec, "curl x"))).rejects.toMatchObject({
      code: "permission_denied",
      message: expect.stringMatching(/"no curl"/),
    });
    expect(decider.denials[0]).toMatchObject({ kind: "start", rule: "no curl", request: { commandLine: "curl x" } });

    const held = await g.checkStart(route, {}, type[codec], startBody(codec, "rm -rf /x")).catch((e) => e);
    expect(held).toBeInstanceOf(ExecGateError);
    expect(held).toMatchObject({ code: "failed_precondition", approvalId: "apr_00000000000000000001" });

    // The approval in Start's envs is taken out before envd sees the request, and the digest is the same.
    const forwarded = await g.checkStart(
      route,
      {},
      type[codec],
      startBody(codec, "rm -rf /x", { WARREN_APPROVAL_ID: "apr_00000000000000000001" }),
    );
    expect(forwarded.includes("WARREN_APPROVAL_ID")).toBe(false);
    expect(decider.redeemed[0]?.digest).toBe(decider.reviews[0]?.digest);
  });

  it("gives the same digest in both codecs, and another for any change", async () => {
    const digests: string[] = [];
    for (const [codec, script, user] of [
      ["json", "rm -rf /x", undefined],
      ["proto", "rm -rf /x", undefined],
      ["json", "rm -rf /y", undefined],
      ["json", "rm -rf /x", "root"],
    ] as const) {
      const { gate: g, decider } = gate(policy);
      const auth = user ? { authorization: `Basic ${Buffer.from(`${user}:`).toString("base64")}` } : {};
      await g.checkStart(route, auth, type[codec], startBody(codec, script)).catch(() => undefined);
      digests.push(decider.reviews[0]?.digest as string);
    }
    expect(digests[0]).toBe(digests[1]);
    expect(new Set(digests).size).toBe(3);
  });

  it("refuses what it cannot judge", async () => {
    const { gate: g } = gate(policy);
    await expect(g.checkStart(route, {}, type.json, Buffer.from("nope"))).rejects.toMatchObject({
      code: "invalid_argument",
    });
    const compressed = startBody("json", "true");
    compressed[0] = 1;
    await expect(g.checkStart(route, {}, type.json, compressed)).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(g.checkStart(route, {}, "text/plain", startBody("json", "true"))).rejects.toMatchObject({
      code: "invalid_argument",
    });
  });
});

describe("ExecGate file operations", () => {
  it("judges an upload by its path query, or by every part's filename", async () => {
    const { gate: g } = gate(policy);
    await expect(
      g.checkUpload(route, {}, "/files?path=/etc/x", "application/octet-stream", async () => Buffer.alloc(0)),
    ).rejects.toMatchObject({ code: "permission_denied" });
    expect(await g.checkUpload(route, {}, "/files?path=/tmp/x", "", async () => Buffer.alloc(0))).toBeUndefined();

    const boundary = "XyZ";
    const form = (names: string[]) =>
      Buffer.from(
        `${names
          .map(
            (n) =>
              `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${n}"\r\n` +
              "Content-Type: application/octet-stream\r\n\r\ndata\r\n",
          )
          .join("")}--${boundary}--\r\n`,
      );
    const contentType = `multipart/form-data; boundary=${boundary}`;
    const ok = form(["/tmp/a", "b"]);
    expect(await g.checkUpload(route, {}, "/files", contentType, async () => ok)).toBe(ok);
    await expect(
      g.checkUpload(route, {}, "/files", contentType, async () => form(["/tmp/a", "/etc/passwd"])),
    ).rejects.toMatchObject({ code: "permission_denied" });
  });

  it("decodes Move as a remove and a write", async () => {
    const { gate: g } = gate(policy);
    const body = Buffer.from(JSON.stringify({ source: "/tmp/a", destination: "/etc/a" }));
    await expect(
      g.checkFileRpc(route, {}, "/filesystem.Filesystem/Move", "application/json", async () => body),
    ).rejects.toMatchObject({ code: "permission_denied" });
    const fine = Buffer.from(JSON.stringify({ source: "/tmp/a", destination: "/tmp/b" }));
    await expect(
      g.checkFileRpc(route, {}, "/filesystem.Filesystem/Move", "application/json", async () => fine),
    ).resolves.toBe(fine);
    // No policy: the body is never read.
    const open = gate(undefined).gate;
    let read = false;
    const unread = await open.checkFileRpc(route, {}, "/filesystem.Filesystem/Remove", "application/json", async () => {
      read = true;
      return fine;
    });
    expect(unread).toBeUndefined();
    expect(read).toBe(false);
  });

  it("resolves paths as envd does and reads Basic users", () => {
    expect(resolvePath("a/../b", "user")).toBe("/home/user/b");
    expect(resolvePath("~/x", "root")).toBe("/root/x");
    expect(resolvePath("/etc/../tmp", "user")).toBe("/tmp");
    expect(basicUser(`Basic ${Buffer.from("root:").toString("base64")}`)).toBe("root");
    expect(basicUser(undefined)).toBeUndefined();
  });
});

describe("RedisPolicySource (the machine's Redis, a key prefix of its own)", () => {
  const redis = new Redis("redis://127.0.0.1:6379", { keyPrefix: `test-exec-gate-${randomBytes(4).toString("hex")}:` });
  const source = new RedisPolicySource(redis);
  afterAll(async () => {
    await redis.del(execPolicyKey("team_a"), EXEC_POLICIES_SYNCED_KEY);
    redis.disconnect();
  });

  it("fails closed without the master's stamp, even when the team's policy is there", async () => {
    await redis.set(execPolicyKey("team_a"), JSON.stringify(policy));
    await expect(source.policyOf("team_a")).rejects.toMatchObject({
      code: "aborted",
      message: expect.stringMatching(/not loaded yet/),
    });
    await redis.set(EXEC_POLICIES_SYNCED_KEY, new Date().toISOString());
    expect((await source.policyOf("team_a"))?.rules).toHaveLength(3);
    expect(await source.policyOf("team_without_policy")).toBeUndefined();
  });
});
