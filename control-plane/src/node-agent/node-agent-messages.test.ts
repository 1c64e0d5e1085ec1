import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  CreateRequestSchema,
  ResumeRequestSchema,
  RunCommandResponseSchema,
  SandboxState,
  StatsResponseSchema,
} from "@warren/proto/nodeagent/v1/node_agent_pb";
import { describe, expect, it } from "vitest";
import {
  commandEventMessage,
  createInputOf,
  createResponseOf,
  egressOf,
  infoResponseOf,
  logLineMessage,
  resumeInputOf,
  sandboxInfoOf,
  snapshotInfoOf,
  statsResponseOf,
} from "./node-agent-messages.js";

const resources = { cpuCount: 2, memoryMB: 1024, diskSizeMB: 4096, pidsMax: 512 };

describe("the node agent's messages", () => {
  it("a create's defaults are absent fields, and 0 resources the template's", () => {
    const bare = createInputOf(create(CreateRequestSchema, { sandboxId: "sbx1", teamId: "t", templateId: "base" }));
    expect(bare.resources).toEqual({ cpuCount: 0, memoryMB: 0, diskSizeMB: 0 });
    expect(bare).not.toHaveProperty("egress");
    expect(bare).not.toHaveProperty("snapshotId");
    expect(bare).not.toHaveProperty("snapshotEnvdAccessToken");
    expect(bare).not.toHaveProperty("volumeMounts");
  });

  it("a create's given fields reach the agent, resources in MiB", () => {
    const sent = create(CreateRequestSchema, {
      sandboxId: "sbx1",
      teamId: "t",
      templateId: "base",
      resources: { cpuCount: 1.5, memoryMb: 512, diskSizeMb: 2048 },
      envVars: { A: "1" },
      envdAccessToken: "tok",
      trafficTokenHash: "ab",
      publicTraffic: true,
      autoResume: true,
      metadata: { m: "v" },
      defaultUser: "root",
      defaultWorkdir: "/",
      maskRequestHost: "localhost",
      warmPool: true,
      egress: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
      snapshotId: "snap1",
      snapshotEnvdAccessToken: "old",
      volumeMounts: [{ volumeId: "vol1", path: "/mnt/data" }],
    });
    expect(createInputOf(fromBinary(CreateRequestSchema, toBinary(CreateRequestSchema, sent)))).toEqual({
      sandboxId: "sbx1",
      teamId: "t",
      templateId: "base",
      resources: { cpuCount: 1.5, memoryMB: 512, diskSizeMB: 2048 },
      envVars: { A: "1" },
      envdAccessToken: "tok",
      trafficTokenHash: "ab",
      publicTraffic: true,
      autoResume: true,
      metadata: { m: "v" },
      defaultUser: "root",
      defaultWorkdir: "/",
      maskRequestHost: "localhost",
      warmPool: true,
      egress: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
      snapshotId: "snap1",
      snapshotEnvdAccessToken: "old",
      volumeMounts: [{ volumeId: "vol1", path: "/mnt/data" }],
    });
  });

  it("a resume carries its token and env vars", () => {
    const req = create(ResumeRequestSchema, {
      sandboxId: "sbx1",
      memory: true,
      envVars: { A: "1" },
      envdAccessToken: "t",
    });
    expect(resumeInputOf(req)).toEqual({ sandboxId: "sbx1", memory: true, envVars: { A: "1" }, envdAccessToken: "t" });
  });

  it("an UpdateEgress without a policy closes the sandbox", () => {
    expect(egressOf(undefined)).toEqual({ allowOut: [], denyOut: ["0.0.0.0/0"] });
    expect(egressOf(create(CreateRequestSchema, { egress: { allowOut: ["a.com"] } }).egress)).toEqual({
      allowOut: ["a.com"],
      denyOut: [],
    });
  });

  it("a placement's generation and a sandbox's start time go out as 64-bit integers", () => {
    const placement = {
      sandboxId: "sbx1",
      exec: "e1",
      generation: 2 ** 40,
      sandboxAddr: "10.1.0.2",
      envdUrl: "http://10.1.0.2:49983",
      envdVersion: "0.6.4",
      pooled: true,
    };
    expect(createResponseOf(placement)).toMatchObject({ ...placement, generation: 2n ** 40n });
    const info = sandboxInfoOf({
      sandboxId: "sbx1",
      exec: "e1",
      generation: 1,
      instanceId: "i1",
      templateId: "base",
      teamId: "t",
      sandboxAddr: "10.1.0.2",
      envdUrl: "u",
      resources,
      startedAt: 1_764_650_000_000,
      metadata: { m: "v" },
      paused: true,
    });
    expect(info).toMatchObject({
      state: SandboxState.PAUSED,
      resources: { cpuCount: 2, memoryMb: 1024, diskSizeMb: 4096 },
      startedAt: 1_764_650_000_000n,
      metadata: { m: "v" },
    });
  });

  it("stats cap what the wire cannot carry and fill absent lease fields", () => {
    const stats = {
      memoryUsageBytes: 100,
      memoryLimitBytes: Number.MAX_VALUE,
      cpuUsageUsec: 5,
      pids: 3,
      pidsLimit: 2 ** 40,
      diskUsageBytes: 7,
      diskLimitBytes: 9,
    };
    const sent = create(
      StatsResponseSchema,
      statsResponseOf("sbx1", stats, [{ seq: 1, type: "process.lease", pid: 9, ttlMs: 1000, at: "now" }]),
    );
    expect(sent).toMatchObject({
      sandboxId: "sbx1",
      memoryLimitBytes: BigInt(Number.MAX_SAFE_INTEGER),
      pidsLimit: 2 ** 32 - 1,
      oomKills: 0,
      leaseEvents: [{ seq: 1n, type: "process.lease", pid: 9, tag: "", ttlMs: 1000n, signal: "", at: "now" }],
    });
  });

  it("snapshots, log lines, command events and node info map field for field", () => {
    expect(
      snapshotInfoOf({
        snapshotId: "snap1",
        driver: "namespace",
        templateId: "base",
        templateHash: "h",
        memory: false,
        resources,
        sizeBytes: 4096,
        createdAt: 1_764_650_000_000,
      }),
    ).toMatchObject({ snapshotId: "snap1", sizeBytes: 4096n, createdAt: 1_764_650_000_000n, driver: "namespace" });
    expect(logLineMessage({ timestampMs: 5, level: "warn", message: "m", fields: { a: "b" } })).toEqual({
      timestampMs: 5n,
      level: "warn",
      message: "m",
      fields: { a: "b" },
    });
    const data = new TextEncoder().encode("x");
    const events = [
      commandEventMessage({ kind: "pid", pid: 4 }),
      commandEventMessage({ kind: "stderr", data }),
      commandEventMessage({ kind: "exit", exitCode: -1, status: "signal: killed" }),
    ].map((init) => create(RunCommandResponseSchema, init).event);
    expect(events).toEqual([
      { case: "pid", value: 4 },
      { case: "stderr", value: data },
      { case: "exit", value: expect.objectContaining({ exitCode: -1, status: "signal: killed" }) },
    ]);
    expect(
      infoResponseOf({
        nodeId: "n",
        addr: "a:1",
        driver: "namespace",
        cpuCount: 4,
        memoryTotalBytes: 8,
        memoryFreeBytes: 2,
        sandboxes: 1,
        pools: { base: 2 },
        templates: ["base"],
        servable: ["base"],
      }),
    ).toEqual({
      nodeId: "n",
      addr: "a:1",
      driver: "namespace",
      cpuCount: 4,
      memoryTotalBytes: 8n,
      memoryFreeBytes: 2n,
      sandboxes: 1,
      pools: { base: 2 },
      templates: ["base"],
    });
  });
});
