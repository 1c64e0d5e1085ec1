import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestEnv } from "./api-harness.js";

/** Graceful shutdown: in-flight requests finish, SSE followers are ended, new connections are refused. */
describe("api graceful shutdown", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
    ({ apiKey } = await env.team("shutdown"));
  });
  afterAll(() => env.stop());

  it("ends open event streams, lets an in-flight create finish, then refuses connections", async () => {
    const url = env.api.url;
    let opened: () => void = () => undefined;
    const streamOpen = new Promise<void>((resolve) => {
      opened = resolve;
    });
    const streamEnded = new Promise<string>((resolve, reject) => {
      http
        .get(`${url}/warren/v1/events/stream`, { headers: { "X-API-KEY": apiKey } }, (res) => {
          let body = "";
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => {
            body += chunk;
            opened();
          });
          res.on("end", () => resolve(body));
        })
        .on("error", reject);
    });
    await streamOpen;
    // Hold the create on the node so it is certainly in flight when the api stops.
    const node = env.nodes.get("node-a");
    if (!node) throw new Error("no node");
    const original = node.create.bind(node);
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let reached: () => void = () => undefined;
    const atNode = new Promise<void>((resolve) => {
      reached = resolve;
    });
    node.create = async (request) => {
      reached();
      await gate;
      return original(request);
    };
    const inFlight = env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    await atNode;
    const stopped = env.api.stop();
    release();
    await stopped;
    expect((await inFlight).status).toBe(201);
    expect(await streamEnded).toContain(": following sandbox events");
    await expect(fetch(`${url}/health`)).rejects.toThrow();
    // The harness stops the api again in afterAll; make that a no-op.
    (env as { api: unknown }).api = undefined;
  });
});

describe("api without a master", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start();
    ({ apiKey } = await env.team("no-master"));
    const master = env.masters.pop();
    await master?.stop();
  });
  afterAll(() => env.stop());

  it("answers 503 with an E2B error body when the master is unreachable, and still serves reads", async () => {
    const res = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    expect(res.status).toBe(503);
    expect(res.body).toMatchObject({ code: 503 });
    const list = await env.request("GET", "/v2/sandboxes", { apiKey });
    expect(list.status).toBe(200);
  });
});
