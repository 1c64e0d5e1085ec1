import { randomBytes } from "node:crypto";
import type { SandboxRoute } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RoutePublisher } from "./routes.js";

const REDIS_URL = "redis://127.0.0.1:6379";

function route(sandboxId: string, node: string): SandboxRoute {
  return {
    sandboxId,
    exec: randomBytes(4).toString("hex"),
    generation: 1,
    node,
    nodeAddr: "127.0.0.1:1",
    sandboxAddr: "10.219.0.2",
    ports: {},
    state: "running",
    team: "team-1",
    public: true,
    trafficTokenHash: "",
    autoResume: false,
    maskRequestHost: "",
  };
}

describe("RoutePublisher under WARREN_REDIS_PREFIX (real Redis)", () => {
  const prefixA = `wt-${randomBytes(4).toString("hex")}:`;
  const prefixB = `wt-${randomBytes(4).toString("hex")}:`;
  const node = `node-${randomBytes(3).toString("hex")}`;
  const storeA = new RoutePublisher(REDIS_URL, prefixA);
  const storeB = new RoutePublisher(REDIS_URL, prefixB);
  const plain = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  const listener = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  const messages: { channel: string; message: string }[] = [];

  beforeAll(async () => {
    await Promise.all([storeA.connect(), storeB.connect()]);
    listener.on("message", (channel: string, message: string) => messages.push({ channel, message }));
    await listener.subscribe(`${prefixA}warren:route-events`, `${prefixB}warren:route-events`, "warren:route-events");
  });

  afterAll(async () => {
    for (const prefix of [prefixA, prefixB]) {
      const keys = await plain.keys(`${prefix}*`);
      if (keys.length > 0) await plain.del(...keys);
    }
    await Promise.all([storeA.close(), storeB.close(), plain.quit(), listener.quit()]);
  });

  it("writes keys and events under its prefix, invisible to another prefix", async () => {
    const written = route(`s${randomBytes(6).toString("hex")}`, node);
    expect(await storeA.write(written)).toBe(true);

    expect(await storeA.read(written.sandboxId)).toEqual(written);
    expect(await storeB.read(written.sandboxId)).toBeUndefined();
    expect(await plain.exists(`warren:route:${written.sandboxId}`)).toBe(0);
    expect(await plain.exists(`${prefixA}warren:route:${written.sandboxId}`)).toBe(1);

    expect((await storeA.routesOfNode(node)).map((r) => r.sandboxId)).toEqual([written.sandboxId]);
    expect(await storeB.routesOfNode(node)).toEqual([]);

    expect(await storeB.delete(written.sandboxId, written.exec, 1)).toBe(false);
    expect(await storeA.delete(written.sandboxId, written.exec, 1)).toBe(true);
    // Other tests publish on the unprefixed channel at the same time: look at this sandbox's events only.
    const mine = () => messages.filter((m) => m.message.includes(written.sandboxId));
    await expect.poll(() => mine().length).toBe(2);
    expect(mine().map((m) => m.channel)).toEqual([`${prefixA}warren:route-events`, `${prefixA}warren:route-events`]);
  });

  it("heartbeats under its prefix", async () => {
    const beat = {
      nodeId: node,
      addr: "127.0.0.1:1",
      driver: "namespace",
      cpuCount: 2,
      memoryTotalBytes: 1,
      memoryFreeBytes: 1,
      sandboxes: 0,
      pools: {},
      templates: ["base"],
      updatedAt: Date.now(),
    };
    // false: the key was not there yet (what tells an agent to republish its routes).
    expect(await storeA.heartbeat(beat)).toBe(false);
    expect(await storeA.heartbeat(beat)).toBe(true);
    expect(await plain.sismember(`${prefixA}warren:nodes`, node)).toBe(1);
    expect(await plain.hget(`${prefixA}warren:node:${node}`, "driver")).toBe("namespace");
    expect(await plain.exists(`${prefixB}warren:node:${node}`, `warren:node:${node}`)).toBe(0);
    await storeA.removeNode(node);
    expect(await plain.exists(`${prefixA}warren:node:${node}`)).toBe(0);
  });
});
