import { routeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../src/node-agent/log.js";
import { type RunningNodeAgent, startNodeAgent } from "../src/node-agent/node-agent.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { agentClient, BUILD_TIMEOUT_MS, sdkSandbox, testConfig } from "./node-agent-harness.js";

// A memory snapshot through the node agent's API, as the master drives it for createSnapshot/fork: the new
// sandbox continues the source's processes, and /init hands it its own access token (presenting the source's,
// which its envd still holds). TCG, asked for explicitly (CI has no real KVM).
const config = testConfig({
  instance: "mk",
  cidr: "10.240.0.0/22",
  extraEnv: { WARREN_DRIVER: "microvm-tcg", WARREN_CHECKPOINT_AFTER_MS: "-1" },
});
const redis = new Redis(config.redisUrl);
let running: RunningNodeAgent<MicrovmDriver>;
let client: ReturnType<typeof agentClient>;
const created = new Set<string>();

async function purge(): Promise<void> {
  const { microvm } = await selectRuntime(config, silentLogger);
  if (!microvm) return;
  await microvm.start();
  const { adopted } = await microvm.reconcile();
  for (const instance of adopted) await microvm.kill(instance.instanceId);
  for (const snapshot of await microvm.listSnapshots()) await microvm.deleteSnapshot(snapshot.snapshotId);
}

beforeAll(async () => {
  await purge();
  const { microvm } = await selectRuntime(config, silentLogger);
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  running = await startNodeAgent(config, silentLogger, microvm);
  client = agentClient(running);
  await running.agent.ensureTemplate("base");
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const id of created) await client.kill({ sandboxId: id }).catch(() => undefined);
  await running?.stop({ killAll: true });
  await purge();
  for (const id of created) await redis.del(routeKey(id));
  redis.disconnect();
}, 120_000);

describe("memory snapshots through the node agent (microvm, TCG)", () => {
  it("a sandbox from a memory snapshot runs the source's processes and answers only its own token", async () => {
    await client.create({
      sandboxId: "mksrc",
      teamId: "team-mk",
      templateId: "base",
      envdAccessToken: "token-mksrc",
      envVars: { ORIGIN: "source" },
    });
    created.add("mksrc");
    const source = sdkSandbox("mksrc", running.agent.get("mksrc")?.envdUrl ?? "", "token-mksrc");
    // A process whose state exists only in memory: a counter it keeps in a shell variable.
    const counter = await source.commands.run(
      "n=0; trap 'echo $n > /tmp/count-now' USR1; while :; do n=$((n+1)); sleep 0.2; done",
      { background: true },
    );
    await new Promise((r) => setTimeout(r, 1000));

    const made = await client.snapshot({ sandboxId: "mksrc", snapshotId: "smkfork" });
    expect(made.snapshot).toMatchObject({ snapshotId: "smkfork", memory: true, templateId: "base" });
    expect((await client.listSnapshots({})).snapshots.map((s) => s.snapshotId)).toContain("smkfork");

    // Wrong hand-over token: envd refuses the second /init; nothing is left of the attempt.
    const instancesBefore = running.driver.list().length;
    await expect(
      client.create({
        sandboxId: "mkbad",
        teamId: "team-mk",
        templateId: "base",
        envdAccessToken: "token-mkbad",
        snapshotId: "smkfork",
        snapshotEnvdAccessToken: "not-the-source-token",
      }),
    ).rejects.toThrow(/init/);
    expect(running.driver.list().length).toBe(instancesBefore);
    expect(await redis.exists(routeKey("mkbad"))).toBe(0);

    await client.create({
      sandboxId: "mkfork",
      teamId: "team-mk",
      templateId: "base",
      envdAccessToken: "token-mkfork",
      envVars: { ORIGIN: "fork" },
      snapshotId: "smkfork",
      snapshotEnvdAccessToken: "token-mksrc",
    });
    created.add("mkfork");
    const envdUrl = running.agent.get("mkfork")?.envdUrl ?? "";
    const fork = sdkSandbox("mkfork", envdUrl, "token-mkfork");
    expect((await fork.commands.list()).map((p) => p.pid)).toContain(counter.pid);
    const counted = await fork.commands.run(
      `kill -USR1 ${counter.pid}; for i in $(seq 50); do test -s /tmp/count-now && break; sleep 0.1; done; cat /tmp/count-now`,
    );
    // The counter went on from where the source's was (a fresh process would restart at a few).
    expect(Number(counted.stdout.trim())).toBeGreaterThanOrEqual(4);
    // Its own identity from the second /init: env vars (the master passes the source's, merged with the request's).
    expect((await fork.commands.run("echo $ORIGIN")).stdout.trim()).toBe("fork");
    // The source's token no longer opens the fork's envd.
    await expect(sdkSandbox("mkfork", envdUrl, "token-mksrc").commands.run("true")).rejects.toThrow();
    // The source runs on with its own token.
    expect((await source.commands.list()).map((p) => p.pid)).toContain(counter.pid);

    await client.deleteSnapshot({ snapshotId: "smkfork" });
    expect((await client.listSnapshots({})).snapshots).toEqual([]);
    expect((await fork.commands.run("echo alive")).stdout.trim()).toBe("alive");
  }, 300_000);
});
