import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import { purgeAgent, startTestAgent, testConfig } from "./node-agent-harness.js";

// Needs root. The agent talks to a redis-server of the test's own, which the test stops: the machine's Redis and
// every other test keep theirs.
const PORT = 23791;
const REDIS_URL = `redis://127.0.0.1:${PORT}`;

let redis: ChildProcess | undefined;
let running: RunningNodeAgent;
const setup = { instance: "rd", cidr: "10.202.0.0/24", netPoolSize: 1, extraEnv: { WARREN_REDIS_URL: REDIS_URL } };

async function startRedis(): Promise<void> {
  redis = spawn(
    "redis-server",
    ["--port", String(PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
    { stdio: "ignore" },
  );
  const client = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on("error", () => undefined);
  for (let i = 0; i < 100; i++) {
    if (
      await client.connect().then(
        () => client.ping(),
        () => undefined,
      )
    )
      break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  client.disconnect();
}

async function stopRedis(): Promise<void> {
  const child = redis;
  redis = undefined;
  if (!child || child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await exited;
}

beforeAll(async () => {
  await startRedis();
  running = await startTestAgent(setup);
}, 600_000);

afterAll(async () => {
  if (!redis) await startRedis();
  await running?.stop({ killAll: true });
  await purgeAgent(testConfig(setup));
  await stopRedis();
}, 120_000);

describe("a kill while Redis is away", () => {
  it("still kills the sandbox and reclaims it, and says its route could not be deleted", async () => {
    const { agent, driver } = running;
    await agent.create({ sandboxId: "rdkill1", teamId: "t", templateId: "base", envdAccessToken: "tok" });
    const instanceId = agent.get("rdkill1")?.instanceId as string;
    const instanceDir = driver.instanceDir(instanceId);
    expect(readFileSync("/proc/self/mountinfo", "utf8")).toContain(instanceDir);

    await stopRedis();
    await expect(agent.kill("rdkill1")).rejects.toThrow(/was killed, but its route could not be deleted/);

    // The sandbox is gone all the same: not listed, no instance, and once reclaimed no mount of it is left.
    expect(agent.get("rdkill1")).toBeUndefined();
    expect(driver.list().some((instance) => instance.instanceId === instanceId)).toBe(false);
    await driver.settled?.();
    expect(readFileSync("/proc/self/mountinfo", "utf8")).not.toContain(instanceDir);
    // A second kill (the master's retry) finds nothing to kill.
    await expect(agent.kill("rdkill1")).rejects.toThrow(/is not on this node/);
  }, 120_000);
});
