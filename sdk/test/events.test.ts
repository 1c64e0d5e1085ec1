import type { ServerResponse } from "node:http";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { Sandbox, type SandboxEvent } from "../src/index.js";
import { json, type RecordingServer, startRecordingServer } from "./harness.js";

let api: RecordingServer;
const event = (id: number, type = "sandbox.created") => ({
  id: String(id),
  sandboxID: "isbx1",
  type,
  fromState: "creating",
  toState: "running",
  data: { n: id },
  timestamp: "2026-01-01T00:00:00Z",
});

beforeAll(async () => {
  api = await startRecordingServer();
});
afterEach(() => {
  api.requests.length = 0;
});
afterAll(async () => {
  await api?.close();
});

const sandbox = () =>
  new Sandbox({
    sandboxId: "isbx1",
    envdVersion: "0.6.4",
    apiKey: "key-e",
    apiUrl: "",
    sandboxUrl: "http://127.0.0.1:9",
  });

describe("sandbox.events() over the ledger", () => {
  test("reads pages with ?cursor= until an empty page, resuming after the last id", async () => {
    api.handle((req, res) => {
      const cursor = new URL(req.url, api.url).searchParams.get("cursor");
      if (cursor === null) return json(res, 200, { events: [event(1), event(2)], cursor: "2" });
      if (cursor === "2") return json(res, 200, { events: [event(3, "sandbox.paused")], cursor: "3" });
      json(res, 200, { events: [], cursor });
    });
    const sbx = new Sandbox({
      sandboxId: "isbx1",
      envdVersion: "0.6.4",
      apiKey: "key-e",
      apiUrl: api.url,
      sandboxUrl: "http://127.0.0.1:9",
    });
    const seen: SandboxEvent[] = [];
    for await (const e of sbx.events()) seen.push(e);
    expect(seen.map((e) => [e.id, e.type])).toEqual([
      ["1", "sandbox.created"],
      ["2", "sandbox.created"],
      ["3", "sandbox.paused"],
    ]);
    expect(seen[0]).toMatchObject({ sandboxId: "isbx1", fromState: "creating", toState: "running", data: { n: 1 } });
    expect(seen[0]?.timestamp).toEqual(new Date("2026-01-01T00:00:00Z"));
    expect(api.requests.map((r) => r.url)).toEqual([
      "/warren/v1/sandboxes/isbx1/events",
      "/warren/v1/sandboxes/isbx1/events?cursor=2",
      "/warren/v1/sandboxes/isbx1/events?cursor=3",
    ]);
    expect(api.requests[0]?.headers["x-api-key"]).toBe("key-e");
  });

  test("an explicit cursor starts after it; a bare JSON list is accepted too", async () => {
    api.handle((req, res) => {
      const cursor = new URL(req.url, api.url).searchParams.get("cursor");
      json(res, 200, cursor === "10" ? [event(11)] : []);
    });
    const sbx = new Sandbox({
      sandboxId: "isbx1",
      envdVersion: "0.6.4",
      apiKey: "k",
      apiUrl: api.url,
      sandboxUrl: "http://127.0.0.1:9",
    });
    const ids: string[] = [];
    for await (const e of sbx.events({ cursor: "10" })) ids.push(e.id);
    expect(ids).toEqual(["11"]);
  });

  test("follow reads SSE and, after the stream drops, resumes with Last-Event-ID: no event lost or repeated", async () => {
    const writeEvents = (res: ServerResponse, ids: number[]) => {
      for (const id of ids) res.write(`id: ${id}\nevent: sandbox.state\ndata: ${JSON.stringify(event(id))}\n\n`);
    };
    api.handle((req, res) => {
      expect(req.headers.accept).toBe("text/event-stream");
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write(": following\n\n");
      const last = req.headers["last-event-id"];
      if (last === undefined) {
        writeEvents(res, [1, 2]);
        setTimeout(() => res.socket?.destroy(), 50); // drop mid-stream
      } else if (last === "2") {
        writeEvents(res, [3]);
        res.end(); // the server ends the stream; the client follows on
      } else {
        writeEvents(res, [4]);
      }
    });
    const controller = new AbortController();
    const sbx = new Sandbox({
      sandboxId: "isbx1",
      envdVersion: "0.6.4",
      apiKey: "k",
      apiUrl: api.url,
      sandboxUrl: "http://127.0.0.1:9",
    });
    const ids: string[] = [];
    for await (const e of sbx.events({ follow: true, signal: controller.signal })) {
      ids.push(e.id);
      if (ids.length === 4) controller.abort();
    }
    expect(ids).toEqual(["1", "2", "3", "4"]);
    const streams = api.requests.filter((r) => r.url === "/warren/v1/sandboxes/isbx1/events/stream");
    expect(streams.map((r) => r.headers["last-event-id"])).toEqual([undefined, "2", "3"]);
  });

  test("the events iterator is lazy: nothing is requested until iteration starts", () => {
    sandbox().events();
    expect(api.requests).toHaveLength(0);
  });
});
