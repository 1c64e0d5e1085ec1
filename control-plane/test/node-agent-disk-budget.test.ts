import { statfsSync } from "node:fs";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import {
  agentClient,
  BUILD_TIMEOUT_MS,
  hostFootprint,
  purgeAgent,
  startTestAgent,
  testConfig,
} from "./node-agent-harness.js";

// A node never promises sandbox disks (sparse images) beyond its free space times WARREN_DISK_OVERCOMMIT: here the
// ratio is set so that the agent's state directory has 2.5 GiB to promise, whatever this host's disk holds.
const GiB = 2 ** 30;
const fs = statfsSync("/var/lib/warren");
const OVERCOMMIT = ((2.5 * GiB) / (fs.bavail * fs.bsize)).toFixed(6);
const SETUP = { instance: "tk", cidr: "10.210.48.0/22", extraEnv: { WARREN_DISK_OVERCOMMIT: OVERCOMMIT } };
const config = testConfig(SETUP);
let running: RunningNodeAgent;
let client: ReturnType<typeof agentClient>;

beforeAll(async () => {
  running = await startTestAgent(SETUP);
  client = agentClient(running);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await running?.stop({ killAll: true });
  await purgeAgent(config);
}, 120_000);

const create = (sandboxId: string, diskSizeMb: number) =>
  client.create({
    sandboxId,
    teamId: "team-a",
    templateId: "base",
    envdAccessToken: `token-${sandboxId}`,
    resources: { diskSizeMb },
  });

describe("disk budget", () => {
  it("refuses a disk the node cannot promise (resource_exhausted, so the master tries another node), leaving nothing; a kill frees its promise", async () => {
    await create("diskone", 1024);
    const before = hostFootprint(config);
    const refused = await create("disktwo", 2048).then(
      () => undefined,
      (error: unknown) => ConnectError.from(error),
    );
    expect(refused?.code).toBe(Code.ResourceExhausted);
    expect(refused?.rawMessage).toMatch(/cannot promise a 2048 MiB sandbox disk: .*WARREN_DISK_OVERCOMMIT=/);
    expect(hostFootprint(config)).toEqual(before);
    expect(running.agent.get("disktwo")).toBeUndefined();

    await client.kill({ sandboxId: "diskone" });
    await create("disktwo", 2048);
    await client.kill({ sandboxId: "disktwo" });
  }, 120_000);
});

// The same budget rule with a warm pool holding promises: here 3 GiB to promise, two pooled `base` sandboxes
// (1 GiB disks each) ready.
const POOLED_OVERCOMMIT = ((3 * GiB) / (fs.bavail * fs.bsize)).toFixed(6);
const POOLED = {
  instance: "tkp",
  cidr: "10.210.52.0/22",
  poolSize: 2,
  extraEnv: { WARREN_DISK_OVERCOMMIT: POOLED_OVERCOMMIT, WARREN_POOL_MAX: "2" },
};

describe("disk budget with a warm pool", () => {
  let pooled: RunningNodeAgent;

  beforeAll(async () => {
    pooled = await startTestAgent(POOLED);
    await pooled.agent.pool("base")?.filled();
  }, BUILD_TIMEOUT_MS);

  afterAll(async () => {
    await pooled?.stop({ killAll: true });
    await purgeAgent(testConfig(POOLED));
  }, 120_000);

  it("a create the node has no room for takes the room of idle pooled sandboxes, only as much as it needs", async () => {
    const pool = pooled.agent.pool("base");
    expect(pool?.readyCount).toBe(2);
    // 2 GiB promised to the pool + 1.5 GiB > 3 GiB: one pooled sandbox (1 GiB) is given back, the create starts.
    const placement = await agentClient(pooled).create({
      sandboxId: "diskroom",
      teamId: "team-a",
      templateId: "base",
      envdAccessToken: "token-diskroom",
      resources: { diskSizeMb: 1536 },
    });
    expect(placement.pooled).toBe(false);
    expect(pooled.agent.get("diskroom")).toBeDefined();
    expect(pool?.readyCount).toBe(1);
    await agentClient(pooled).kill({ sandboxId: "diskroom" });
  }, 120_000);
});
