import { randomBytes } from "node:crypto";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  DELETE_ROUTE_SCRIPT,
  parseRedisPrefix,
  parseRouteEvent,
  ROUTE_EVENTS_CHANNEL,
  type RouteEvent,
  routeEventsChannel,
  routeFromHash,
  routeKey,
  routeKeyPattern,
  routeToHash,
  type SandboxRoute,
  sandboxIdOfRouteKey,
  WRITE_ROUTE_SCRIPT,
} from "./redis.js";

function route(sandboxId: string, generation: number, overrides: Partial<SandboxRoute> = {}): SandboxRoute {
  return {
    sandboxId,
    exec: `exec-${generation}`,
    generation,
    node: "node-a",
    nodeAddr: "127.0.0.1:5008",
    sandboxAddr: "10.201.0.2",
    ports: { "8080": "127.0.0.1:18080" },
    state: "running",
    team: "team-1",
    public: true,
    trafficTokenHash: "",
    autoResume: false,
    maskRequestHost: "",
    ...overrides,
  };
}

describe("Redis route contract against a real Redis", () => {
  let redis: Redis;
  let subscriber: Redis;
  const events: RouteEvent[] = [];
  const ids: string[] = [];
  const newId = () => {
    const id = `contract${randomBytes(4).toString("hex")}`;
    ids.push(id);
    return id;
  };

  const write = (r: SandboxRoute) => {
    const event = JSON.stringify({ sandboxId: r.sandboxId, exec: r.exec, generation: r.generation, state: r.state });
    const fields = Object.entries(routeToHash(r)).flat();
    return redis.eval(
      WRITE_ROUTE_SCRIPT,
      1,
      routeKey(r.sandboxId),
      ROUTE_EVENTS_CHANNEL,
      r.generation,
      event,
      ...fields,
    );
  };
  const remove = (sandboxId: string, exec: string) => {
    const event = JSON.stringify({ sandboxId, exec, generation: 0, state: "deleted" });
    return redis.eval(DELETE_ROUTE_SCRIPT, 1, routeKey(sandboxId), ROUTE_EVENTS_CHANNEL, exec, event);
  };

  beforeAll(async () => {
    redis = new Redis({ host: "127.0.0.1", port: 6379, lazyConnect: true });
    subscriber = new Redis({ host: "127.0.0.1", port: 6379, lazyConnect: true });
    await Promise.all([redis.connect(), subscriber.connect()]);
    await subscriber.subscribe(ROUTE_EVENTS_CHANNEL);
    subscriber.on("message", (_channel: string, message: string) => {
      const event = parseRouteEvent(message);
      if (event && ids.includes(event.sandboxId)) events.push(event);
    });
  });
  afterAll(async () => {
    if (ids.length) await redis.del(...ids.map(routeKey));
    subscriber.disconnect();
    redis.disconnect();
  });

  it("a written route reads back field for field", async () => {
    const r = route(newId(), 1, { public: false, trafficTokenHash: "ab".repeat(32), autoResume: true });
    expect(await write(r)).toBe(1);
    expect(routeFromHash(await redis.hgetall(routeKey(r.sandboxId)))).toEqual(r);
  });

  it("a write for an older generation never clobbers a newer incarnation", async () => {
    const id = newId();
    expect(await write(route(id, 2))).toBe(1);
    expect(await write(route(id, 1))).toBe(0);
    expect(routeFromHash(await redis.hgetall(routeKey(id)))?.exec).toBe("exec-2");
    expect(await write(route(id, 3, { state: "paused" }))).toBe(1);
    expect(routeFromHash(await redis.hgetall(routeKey(id)))?.state).toBe("paused");
  });

  it("a delete naming an old exec leaves the current route; the current exec deletes it", async () => {
    const id = newId();
    await write(route(id, 5));
    expect(await remove(id, "exec-4")).toBe(0);
    expect(await redis.exists(routeKey(id))).toBe(1);
    expect(await remove(id, "exec-5")).toBe(1);
    expect(await redis.exists(routeKey(id))).toBe(0);
  });

  it("every accepted change is published on the route-events channel, rejected ones are not", async () => {
    const id = newId();
    await write(route(id, 1));
    await write(route(id, 0));
    await remove(id, "exec-1");
    await redis.ping();
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(events.filter((e) => e.sandboxId === id).map((e) => `${e.exec}:${e.state}`)).toEqual([
      "exec-1:running",
      "exec-1:deleted",
    ]);
  });

  it("rejects malformed ids and incomplete hashes", () => {
    expect(() => routeKey("../etc")).toThrow(/invalid sandbox id/);
    expect(() => routeKey("has-dash")).toThrow(/invalid sandbox id/);
    expect(routeFromHash({ ...routeToHash(route("a", 1)), public: "" })?.public).toBe(false);
    expect(routeFromHash({ exec: "x" })).toBeUndefined();
    expect(routeFromHash({ ...routeToHash(route("a", 1)), state: "weird" })).toBeUndefined();
    expect(parseRouteEvent("not json")).toBeUndefined();
  });
});

describe("WARREN_REDIS_PREFIX", () => {
  it("prefixes the channel and the route-key pattern, and reads ids back from full keys", () => {
    expect(routeEventsChannel("")).toBe(ROUTE_EVENTS_CHANNEL);
    expect(routeEventsChannel("dev:")).toBe("dev:warren:route-events");
    expect(routeKeyPattern("dev:")).toBe("dev:warren:route:*");
    expect(sandboxIdOfRouteKey("dev:warren:route:iabc", "dev:")).toBe("iabc");
    expect(sandboxIdOfRouteKey("warren:route:iabc", "dev:")).toBeUndefined();
    expect(sandboxIdOfRouteKey("dev:warren:route:not-an-id", "dev:")).toBeUndefined();
  });

  it("accepts empty or a short name of letters, digits and _ . : -, nothing else", () => {
    expect(parseRedisPrefix(undefined)).toBe("");
    expect(parseRedisPrefix("team_1.dev:")).toBe("team_1.dev:");
    for (const bad of ["a b", "x*", "{tag}", "x".repeat(65)])
      expect(() => parseRedisPrefix(bad)).toThrow(/WARREN_REDIS_PREFIX/);
  });
});
