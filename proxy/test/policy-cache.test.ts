import { randomBytes } from "node:crypto";
import {
  EXEC_POLICIES_SYNCED_KEY,
  EXEC_POLICY_EVENT_ALL,
  type ExecPolicy,
  execPolicyEventsChannel,
  execPolicyKey,
} from "@warren/proto/exec-policy";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RedisPolicySource } from "../src/exec-gate.js";
import { silentLogger } from "../src/log.js";
import { CachedPolicySource } from "../src/policy-cache.js";

// The machine's Redis under a key prefix of its own; the test plays the master's side of the contract (write the
// key, then announce it on the channel), as control-plane/src/master/exec-policies.ts does.
const prefix = `test-policy-cache-${randomBytes(4).toString("hex")}:`;
const channel = execPolicyEventsChannel(prefix);
const policy = (action: "allow" | "deny"): ExecPolicy => ({ rules: [{ action, command: "rm *" }] });
const until = async (check: () => Promise<boolean>) => {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error("condition never held");
};

describe("CachedPolicySource", () => {
  const redis = new Redis("redis://127.0.0.1:6379", { keyPrefix: prefix, maxRetriesPerRequest: 1 });
  const subscriber = new Redis("redis://127.0.0.1:6379", { autoResubscribe: true, maxRetriesPerRequest: null });
  let reads = 0;
  let failNext = false;
  const redisSource = new RedisPolicySource(redis);
  const counting = {
    policyOf: (team: string) => {
      reads += 1;
      if (failNext) {
        failNext = false;
        return Promise.reject(new Error("Redis away"));
      }
      return redisSource.policyOf(team);
    },
  };
  const cache = new CachedPolicySource(counting, subscriber, prefix, { ttlMs: 60_000, maxTeams: 100 }, silentLogger);
  const announce = (message: string) => redis.publish(channel, message);

  beforeAll(async () => {
    await redis.set(EXEC_POLICIES_SYNCED_KEY, new Date().toISOString());
    await redis.set(execPolicyKey("team_a"), JSON.stringify(policy("deny")));
    await cache.start();
  });
  afterAll(async () => {
    cache.close();
    await redis.del(EXEC_POLICIES_SYNCED_KEY, execPolicyKey("team_a"), execPolicyKey("team_b"));
    redis.disconnect();
    subscriber.disconnect();
  });

  it("reads a team's policy once, then serves it from memory (no policy is kept too)", async () => {
    expect((await cache.policyOf("team_a"))?.rules[0]?.action).toBe("deny");
    expect((await cache.policyOf("team_a"))?.rules[0]?.action).toBe("deny");
    expect(await cache.policyOf("team_b")).toBeUndefined();
    expect(await cache.policyOf("team_b")).toBeUndefined();
    expect(reads).toBe(2);
  });

  it("drops a team's copy when the master announces its change, every copy on a full sync's announcement", async () => {
    await redis.set(execPolicyKey("team_a"), JSON.stringify(policy("allow")));
    await announce("team_a");
    await until(async () => (await cache.policyOf("team_a"))?.rules[0]?.action === "allow");
    const before = reads;
    await cache.policyOf("team_b");
    expect(reads).toBe(before); // team_b's copy survived team_a's event

    await redis.set(execPolicyKey("team_b"), JSON.stringify(policy("deny")));
    await announce(EXEC_POLICY_EVENT_ALL);
    await until(async () => (await cache.policyOf("team_b"))?.rules[0]?.action === "deny");
  });

  it("never keeps a failed read, and fails closed when the mirror lost its stamp", async () => {
    await announce(EXEC_POLICY_EVENT_ALL);
    await until(async () => cache.size === 0);
    failNext = true;
    await expect(cache.policyOf("team_a")).rejects.toThrow(/Redis away/);
    expect((await cache.policyOf("team_a"))?.rules[0]?.action).toBe("allow");

    await redis.del(EXEC_POLICIES_SYNCED_KEY);
    await announce(EXEC_POLICY_EVENT_ALL);
    await until(async () => cache.size === 0);
    await expect(cache.policyOf("team_a")).rejects.toMatchObject({ code: "aborted" });
    await redis.set(EXEC_POLICIES_SYNCED_KEY, new Date().toISOString());
  });

  it("keeps nothing while it cannot hear announcements, and caches again once resubscribed", async () => {
    await cache.policyOf("team_a");
    expect(cache.size).toBeGreaterThan(0);
    subscriber.disconnect(true); // drops the connection; ioredis reconnects and resubscribes
    // Nothing but its own announcements or a lost subscription empties the cache, and none was sent.
    await until(async () => cache.size === 0);
    await until(async () => {
      await cache.policyOf("team_a");
      return cache.size === 1;
    });
    const before = reads;
    await cache.policyOf("team_a");
    expect(reads).toBe(before);
  });
});
