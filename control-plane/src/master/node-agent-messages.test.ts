import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  CreateRequestSchema,
  CreateResponseSchema,
  ImportImageResponseSchema,
  ListResponseSchema,
  LogsResponseSchema,
  RunCommandResponseSchema,
  SandboxState,
  SnapshotInfoSchema,
  StatsResponseSchema,
} from "@warren/proto/nodeagent/v1/node_agent_pb";
import { describe, expect, it } from "vitest";
import { type CreateOnNodeRequest, NodeAgentError } from "./node-agent-client.js";
import {
  commandEventOf,
  createRequestMessage,
  importedImageOf,
  logLinesOf,
  placementOf,
  sandboxesOnNode,
  snapshotOnNode,
  statsOf,
} from "./node-agent-messages.js";

const request: CreateOnNodeRequest = {
  sandboxId: "sbx1",
  teamId: "team",
  templateId: "base",
  resources: { cpuCount: 1.5, memoryMB: 512, diskSizeMB: 2048 },
  envVars: { A: "1" },
  envdAccessToken: "tok",
  trafficTokenHash: "ab",
  publicTraffic: false,
  autoResume: true,
  metadata: { m: "v" },
  egress: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
};

describe("the master's node agent messages", () => {
  it("a create carries every field, optional ones as the proto3 defaults the agent reads as absent", () => {
    const sent = fromBinary(
      CreateRequestSchema,
      toBinary(CreateRequestSchema, create(CreateRequestSchema, createRequestMessage(request))),
    );
    expect(sent).toMatchObject({
      sandboxId: "sbx1",
      teamId: "team",
      templateId: "base",
      resources: { cpuCount: 1.5, memoryMb: 512, diskSizeMb: 2048 },
      envVars: { A: "1" },
      envdAccessToken: "tok",
      trafficTokenHash: "ab",
      publicTraffic: false,
      autoResume: true,
      metadata: { m: "v" },
      egress: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
      snapshotId: "",
      snapshotEnvdAccessToken: "",
      maskRequestHost: "",
      warmPool: false,
      defaultUser: "",
      defaultWorkdir: "",
      volumeMounts: [],
    });
    const full = createRequestMessage({
      ...request,
      snapshotId: "snap1",
      snapshotEnvdAccessToken: "old",
      warmPool: true,
      maskRequestHost: "localhost",
      defaultUser: "root",
      defaultWorkdir: "/",
      volumeMounts: [{ volumeId: "vol1", path: "/mnt/data" }],
    });
    expect(full).toMatchObject({
      snapshotId: "snap1",
      snapshotEnvdAccessToken: "old",
      warmPool: true,
      maskRequestHost: "localhost",
      defaultUser: "root",
      defaultWorkdir: "/",
      volumeMounts: [{ volumeId: "vol1", path: "/mnt/data" }],
    });
  });

  it("a placement leaves an empty envd version out, and a missing placement is a failed call", () => {
    const response = create(CreateResponseSchema, {
      exec: "e1",
      sandboxAddr: "10.1.0.2",
      envdUrl: "u",
      generation: 3n,
    });
    expect(placementOf(response)).toEqual({ exec: "e1", sandboxAddr: "10.1.0.2", envdUrl: "u" });
    expect(placementOf(create(CreateResponseSchema, { exec: "e1", envdVersion: "0.6.4" }))).toMatchObject({
      envdVersion: "0.6.4",
    });
    expect(() => placementOf(undefined)).toThrow(NodeAgentError);
  });

  it("states are names; an unspecified state counts as running", () => {
    const list = create(ListResponseSchema, {
      sandboxes: [
        { sandboxId: "a", exec: "e1", state: SandboxState.RUNNING },
        { sandboxId: "b", exec: "e2", state: SandboxState.PAUSED },
        { sandboxId: "c", exec: "e3" },
      ],
    });
    expect(sandboxesOnNode(list)).toEqual([
      { sandboxId: "a", exec: "e1", state: "running" },
      { sandboxId: "b", exec: "e2", state: "paused" },
      { sandboxId: "c", exec: "e3", state: "running" },
    ]);
  });

  it("64-bit figures become numbers, lease events and OOM victims included", () => {
    const stats = create(StatsResponseSchema, {
      memoryUsageBytes: 3n << 30n,
      memoryLimitBytes: 4n << 30n,
      cpuUsageUsec: 123_456n,
      diskUsageBytes: 10n,
      diskLimitBytes: 20n,
      oomKills: 2,
      oomVictims: [{ process: "python3", memoryBytes: 470n << 20n, at: "2026-12-02T04:00:01Z" }],
      leaseEvents: [
        { seq: 7n, type: "process.lease", pid: 42, tag: "job", ttlMs: 60_000n, at: "2026-12-02T04:00:00Z" },
      ],
    });
    expect(statsOf(stats)).toEqual({
      memoryUsageBytes: 3 * 2 ** 30,
      memoryLimitBytes: 4 * 2 ** 30,
      cpuUsageUsec: 123_456,
      diskUsageBytes: 10,
      diskLimitBytes: 20,
      oomKills: 2,
      oomVictims: [{ process: "python3", memoryBytes: 470 * 2 ** 20, at: "2026-12-02T04:00:01Z" }],
      leaseEvents: [
        { seq: 7, type: "process.lease", pid: 42, tag: "job", ttlMs: 60_000, signal: "", at: "2026-12-02T04:00:00Z" },
      ],
    });
    const logs = create(LogsResponseSchema, {
      lines: [{ timestampMs: 1_764_650_000_000n, level: "info", message: "hi", fields: { a: "b" } }],
    });
    expect(logLinesOf(logs)).toEqual([
      { timestampMs: 1_764_650_000_000, level: "info", message: "hi", fields: { a: "b" } },
    ]);
  });

  it("a snapshot's creation time becomes a Date, and a missing snapshot is a failed call", () => {
    const info = create(SnapshotInfoSchema, {
      snapshotId: "snap1",
      templateId: "base",
      driver: "namespace",
      memory: true,
      sizeBytes: 5n << 20n,
      createdAt: 1_764_650_000_000n,
    });
    expect(snapshotOnNode(info)).toEqual({
      snapshotId: "snap1",
      templateId: "base",
      driver: "namespace",
      memory: true,
      sizeBytes: 5 * 2 ** 20,
      createdAt: new Date(1_764_650_000_000),
    });
    expect(() => snapshotOnNode(undefined)).toThrow("node agent answered without a snapshot");
    const image = create(ImportImageResponseSchema, {
      snapshot: info,
      resolved: "docker.io/library/ubuntu:22.04",
      digest: "sha256:ab",
      env: ["PATH=/bin"],
      user: "root",
      workdir: "/",
      log: ["pulled"],
    });
    expect(importedImageOf(image)).toMatchObject({ resolved: "docker.io/library/ubuntu:22.04", env: ["PATH=/bin"] });
    expect(() => importedImageOf(create(ImportImageResponseSchema, {}))).toThrow(NodeAgentError);
  });

  it("RunCommand messages become tagged events; a message without an event is skipped", () => {
    const data = new TextEncoder().encode("out");
    const events = [
      { event: { case: "pid" as const, value: 42 } },
      { event: { case: "stdout" as const, value: data } },
      { event: { case: "stderr" as const, value: data } },
      { event: { case: "exit" as const, value: { exitCode: 1, status: "exit status 1" } } },
      {},
    ].map((init) => commandEventOf(create(RunCommandResponseSchema, init)));
    expect(events).toEqual([
      { kind: "pid", pid: 42 },
      { kind: "stdout", data },
      { kind: "stderr", data },
      { kind: "exit", exitCode: 1, status: "exit status 1" },
      undefined,
    ]);
  });
});
