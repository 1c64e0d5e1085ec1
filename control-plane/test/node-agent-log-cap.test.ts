import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import { BUILD_TIMEOUT_MS, purgeAgent, sdkSandbox, startTestAgent, testConfig, until } from "./node-agent-harness.js";

// A sandbox's root can write to PID 1's stdout, which is envd.log on the node's disk, outside the sandbox's disk
// quota: the agent keeps that file under WARREN_SANDBOX_LOG_MAX_BYTES (256 KiB here).
const CAP = 256 << 10;
const SETUP = { instance: "th", cidr: "10.210.16.0/22", extraEnv: { WARREN_SANDBOX_LOG_MAX_BYTES: String(CAP) } };
const config = testConfig(SETUP);
let running: RunningNodeAgent;

beforeAll(async () => {
  running = await startTestAgent(SETUP);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await running?.stop({ killAll: true });
  await purgeAgent(config);
}, 120_000);

describe("a sandbox's log on the node stays under its cap", () => {
  it("4 MB appended to PID 1's stdout by the sandbox's root end as a log under the cap that envd and the logs API go on using", async () => {
    const placement = await running.agent.create({
      sandboxId: "logcap",
      teamId: "team-t",
      templateId: "base",
      envdAccessToken: "tok",
    });
    try {
      const sandbox = sdkSandbox("logcap", placement.envdUrl, "tok");
      const logFile = join(config.stateDir, "instances", running.agent.get("logcap")!.instanceId, "envd.log");
      const underCap = () =>
        until("envd.log cut under the cap", 30_000, () => {
          const bytes = statSync(logFile).size;
          return bytes <= CAP ? bytes : undefined;
        });
      // Appending, as PID 1 and envd write (O_APPEND).
      const flood = "head -c 4000000 /dev/zero | tr '\\0' x | fold -w 1000";
      expect((await sandbox.commands.run(`${flood} >> /proc/1/fd/1 && echo flooded`, { user: "root" })).stdout).toBe(
        "flooded\n",
      );
      expect(await underCap()).toBeGreaterThan(CAP / 4); // cut to its end, not emptied
      await sandbox.commands.run("echo after-the-cut >> /proc/1/fd/1", { user: "root" });
      // The writers went on at the new end: no hole of zeros where the old end was.
      expect(readFileSync(logFile, "utf8")).not.toContain("\0");
      const lines = await running.agent.logs("logcap", 10_000);
      expect(lines[0]).toMatchObject({ level: "warn", fields: { component: "warren" } });
      expect(lines[0]!.message).toMatch(/^log cut to its last \d+ bytes: \d+ bytes dropped/);
      expect(lines.map((line) => line.message).slice(-5)).toContain("after-the-cut"); // envd logs on after it
      // Writing at an offset of its own (`>` opens the file anew, truncated, without O_APPEND) is cut down too.
      expect((await sandbox.commands.run(`${flood} > /proc/1/fd/1 && echo flooded`, { user: "root" })).stdout).toBe(
        "flooded\n",
      );
      await underCap();
      expect((await sandbox.commands.run("echo still running")).stdout).toBe("still running\n");
    } finally {
      await running.agent.kill("logcap");
    }
  }, 120_000);
});
