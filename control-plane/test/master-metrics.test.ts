import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually, TestEnv } from "./api-harness.js";

/** The metrics series: the leader samples every running sandbox periodically into PostgreSQL. */
describe("sandbox metrics history", () => {
  const env = new TestEnv();
  let apiKey: string;

  beforeAll(async () => {
    await env.start({ metricsIntervalMs: 100 });
    await env.addNode("node-m");
    ({ apiKey } = await env.team("metrics"));
  });
  afterAll(() => env.stop());

  it("stores a sample of each running sandbox per interval and serves the series, and stops when it is killed", async () => {
    const created = await env.request("POST", "/v2/sandboxes", { apiKey, body: { templateID: "base" } });
    const { sandboxID } = created.body as { sandboxID: string };
    const stored = async () =>
      Number(
        (
          await env.db.query<{ n: string }>("SELECT count(*) AS n FROM sandbox_metrics WHERE sandbox_id = $1", [
            sandboxID,
          ])
        ).rows[0]?.n,
      );
    await eventually(async () => ((await stored()) >= 3 ? true : undefined), 10_000);
    const before = await stored();
    const series = (await env.request("GET", `/sandboxes/${sandboxID}/metrics`, { apiKey })).body as {
      timestampUnix: number;
      memUsed: number;
    }[];
    // The stored series plus the sample this request took, oldest first.
    expect(series.length).toBeGreaterThanOrEqual(before + 1);
    expect(series.map((m) => m.timestampUnix)).toEqual([...series.map((m) => m.timestampUnix)].sort((a, b) => a - b));
    expect(series.every((m) => m.memUsed === 10 * 2 ** 20)).toBe(true);
    await env.request("DELETE", `/sandboxes/${sandboxID}`, { apiKey });
    const afterKill = await stored();
    await new Promise((r) => setTimeout(r, 400));
    expect(await stored()).toBe(afterKill); // nothing sampled once it is gone
  });
});
