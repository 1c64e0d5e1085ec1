import {
  create,
  type DescMessage,
  fromBinary,
  type MessageInitShape,
  type MessageShape,
  toBinary,
} from "@bufbuild/protobuf";
import { parseExecPolicy } from "@warren/proto/exec-policy";
import {
  CreateSandboxRequestSchema,
  SetExecPolicyRequestSchema,
  UpdateSandboxNetworkRequestSchema,
} from "@warren/proto/master/v1/master_pb";
import { execPolicyToMessage, networkConfigToMessage, volumeMountsToMessage } from "@warren/proto/master-requests";
import { describe, expect, it } from "vitest";
import { createNetworkOf, createVolumeMountsOf, execPolicyJsonOf, updatedEgressOf } from "./master-messages.js";

/** What the master receives: the api's message through the binary wire. */
function overTheWire<Desc extends DescMessage>(schema: Desc, init: MessageInitShape<Desc>): MessageShape<Desc> {
  return fromBinary(schema, toBinary(schema, create(schema, init)));
}

const createRequest = (init: MessageInitShape<typeof CreateSandboxRequestSchema>) =>
  overTheWire(CreateSandboxRequestSchema, init);

describe("CreateSandbox's network config", () => {
  it("reads back with exactly the fields the request gave", () => {
    for (const network of [
      { allowOut: ["1.1.1.1", "*.example.com"], denyOut: ["0.0.0.0/0"] },
      { allowOut: [] },
      { denyOut: ["10.0.0.0/8"], allowPublicTraffic: false },
      { allowPublicTraffic: true, maskRequestHost: "localhost:8080" },
      { maskRequestHost: "" },
      {},
    ]) {
      expect(createNetworkOf(createRequest({ network: networkConfigToMessage(network) }))).toEqual(network);
    }
  });

  it("is null when the request has none", () => {
    expect(networkConfigToMessage(null)).toBeUndefined();
    expect(createNetworkOf(createRequest({}))).toBeNull();
  });
});

describe("CreateSandbox's volume mounts", () => {
  const mounts = [
    { name: "data", path: "/mnt/data", volumeId: "vol1" },
    { name: "cache", path: "/home/user/.cache", volumeId: "vol2" },
  ];

  it("read back as the row keeps them ({name, path, volumeId})", () => {
    const stored = createVolumeMountsOf(createRequest({ volumeMounts: volumeMountsToMessage(mounts) }));
    expect(JSON.stringify(stored)).toBe(JSON.stringify(mounts));
  });

  it("are none when the request has none", () => {
    expect(createVolumeMountsOf(createRequest({}))).toEqual([]);
  });
});

describe("UpdateSandboxNetwork's egress", () => {
  const update = (init: MessageInitShape<typeof UpdateSandboxNetworkRequestSchema>) =>
    overTheWire(UpdateSandboxNetworkRequestSchema, init);

  it("is both lists, empty when not given", () => {
    expect(updatedEgressOf(update({ egress: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] } }))).toEqual({
      allowOut: ["1.1.1.1"],
      denyOut: ["0.0.0.0/0"],
    });
    expect(updatedEgressOf(update({ egress: {} }))).toEqual({ allowOut: [], denyOut: [] });
  });

  it("is two empty lists when the request carries none", () => {
    expect(updatedEgressOf(update({}))).toEqual({ allowOut: [], denyOut: [] });
  });
});

describe("SetExecPolicy's policy", () => {
  const setRequest = (init: MessageInitShape<typeof SetExecPolicyRequestSchema>) =>
    overTheWire(SetExecPolicyRequestSchema, init);

  it("is stored as the JSON the api's validated policy serialises to", () => {
    const policy = parseExecPolicy({
      rules: [
        { name: "no sudo", action: "deny", command: "sudo *" },
        { action: "review", asRoot: true },
        { action: "deny", paths: ["/etc/", "/usr/./lib"], ops: ["write"] },
        { action: "allow", paths: ["/home/user"] },
      ],
      default: "review",
      reviewTtlSeconds: 600,
    });
    expect(execPolicyJsonOf(setRequest({ policy: execPolicyToMessage(policy) }))).toBe(JSON.stringify(policy));
  });

  it("leaves defaults out when the policy did not give them", () => {
    const policy = parseExecPolicy({ rules: [] });
    expect(execPolicyJsonOf(setRequest({ policy: execPolicyToMessage(policy) }))).toBe('{"rules":[]}');
  });

  it("clears without a policy", () => {
    expect(execPolicyJsonOf(setRequest({}))).toBe("");
  });

  it("refuses an action the master does not know", () => {
    expect(() => execPolicyJsonOf(setRequest({ policy: { rules: [{ action: 0, command: "x" }] } }))).toThrow(
      "policy.rules[0].action must be allow, deny or review",
    );
  });
});
