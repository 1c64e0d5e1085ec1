import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestEnv } from "./api-harness.js";

interface SseEvent {
  id: string;
  event: string;
  data: { sandboxID: string; type: string; toState: string | null };
}

/** Reads SSE events until `count` arrived, then closes the stream. */
function follow(url: string, headers: Record<string, string>, count: number): Promise<SseEvent[]> {
  return new Promise((resolve, reject) => {
    const events: SseEvent[] = [];
    const req = http.get(url, { headers }, (res) => {
      if (res.statusCode !== 200) {
        reject(new Error(`status ${res.statusCode}`));
        return;
      }
      expect(res.headers["content-type"]).toContain("text/event-stream");
      let buffer = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        buffer += chunk;
        let end = buffer.indexOf("\n\n");
        while (end >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          end = buffer.indexOf("\n\n");
          const fields = Object.fromEntries(
            block
              .split("\n")
              .filter((line) => !line.startsWith(":") && line.includes(": "))
              .map((line) => [line.slice(0, line.indexOf(": ")), line.slice(line.indexOf(": ") + 2)]),
          );
          if (!fields.id) continue;
          events.push({ id: fields.id, event: fields.event, data: JSON.parse(fields.data) });
          if (events.length === count) {
            req.destroy();
            resolve(events);
          }
        }
      });
    });
    req.on("error", (error) => {
      if (events.length < count) reject(error);
    });
  });
}

describe("sandbox_events ledger", () => {
  const env = new TestEnv();
  let apiKey: string;
  let otherKey: string;

  beforeAll(async () => {
    await env.start();
    await env.addNode("node-a");
    ({ apiKey } = await env.team("ledger"));
    ({ apiKey: otherKey } = await env.team("other"));
  });
  afterAll(() => env.stop());

  it("records every transition with an increasing cursor and pages after a cursor", async () => {
    const { sandboxID } = (await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } }))
      .body as { sandboxID: string };
    await env.request("POST", `/sandboxes/${sandboxID}/pause`, { apiKey, body: {} });
    await env.request("POST", `/v2/sandboxes/${sandboxID}/connect`, { apiKey, body: {} });
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey });
    const all = await env.request("GET", `/warren/v1/sandboxes/${sandboxID}/events`, { apiKey });
    const { events } = all.body as { events: { id: string; type: string; toState: string }[] };
    expect(events.map((e) => `${e.type}:${e.toState}`)).toEqual([
      "sandbox.created:starting",
      "sandbox.started:running",
      "sandbox.pausing:pausing",
      "sandbox.paused:paused",
      "sandbox.resuming:resuming",
      "sandbox.resumed:running",
      "sandbox.killed:killed",
    ]);
    const ids = events.map((e) => BigInt(e.id));
    expect([...ids].sort((a, b) => (a < b ? -1 : 1))).toEqual(ids);
    const third = events[2]?.id;
    const page = await env.request("GET", `/warren/v1/sandboxes/${sandboxID}/events?cursor=${third}&limit=2`, {
      apiKey,
    });
    const body = page.body as { events: { type: string }[]; cursor: string };
    expect(body.events.map((e) => e.type)).toEqual(["sandbox.paused", "sandbox.resuming"]);
    expect(body.cursor).toBe(events[4]?.id);
    // The ledger of a killed sandbox stays readable by its team, and only by its team.
    const other = await env.request("GET", `/warren/v1/sandboxes/${sandboxID}/events`, { apiKey: otherKey });
    expect(other.status).toBe(404);
    const teamWide = await env.request("GET", "/warren/v1/events", { apiKey: otherKey });
    expect((teamWide.body as { events: unknown[] }).events).toEqual([]);
  });

  it("rejects updates and deletes of ledger rows (append-only)", async () => {
    const before = await env.db.query("SELECT count(*)::int AS n FROM sandbox_events");
    await env.db.query("UPDATE sandbox_events SET type = 'forged'");
    await env.db.query("DELETE FROM sandbox_events");
    const after = await env.db.query(
      "SELECT count(*)::int AS n, count(*) FILTER (WHERE type = 'forged')::int AS f FROM sandbox_events",
    );
    expect(after.rows[0]).toEqual({ n: before.rows[0].n, f: 0 });
  });

  it("follows the ledger by SSE and resumes after Last-Event-ID without gaps or repeats", async () => {
    const url = `${env.api.url}/warren/v1/events/stream`;
    const start = await env.request("GET", "/warren/v1/events?limit=1000", { apiKey });
    const cursor = (start.body as { cursor: string }).cursor;
    const firstTwo = follow(url, { "X-API-KEY": apiKey, "Last-Event-ID": cursor }, 2);
    const { sandboxID } = (await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } }))
      .body as { sandboxID: string };
    const seen = await firstTwo;
    expect(seen.map((e) => e.event)).toEqual(["sandbox.created", "sandbox.started"]);
    expect(seen.every((e) => e.data.sandboxID === sandboxID)).toBe(true);
    // Events that happen while nobody follows are delivered on reconnect after the last seen id.
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey });
    const resumed = await follow(url, { "X-API-KEY": apiKey, "Last-Event-ID": seen[1]?.id ?? "" }, 1);
    expect(resumed[0]?.event).toBe("sandbox.killed");
    expect(BigInt(resumed[0]?.id ?? 0)).toBeGreaterThan(BigInt(seen[1]?.id ?? 0));
    // The per-sandbox stream replays from the beginning when no Last-Event-ID is given.
    const replay = await follow(
      `${env.api.url}/warren/v1/sandboxes/${sandboxID}/events/stream`,
      { "X-API-KEY": apiKey },
      3,
    );
    expect(replay.map((e) => e.event)).toEqual(["sandbox.created", "sandbox.started", "sandbox.killed"]);
  });
});
