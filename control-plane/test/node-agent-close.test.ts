import { afterAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import {
  agentClient,
  BUILD_TIMEOUT_MS,
  hostFootprint,
  purgeAgent,
  startTestAgent,
  testConfig,
} from "./node-agent-harness.js";

// No warm pool and no network pool (the harness's defaults): every instance on the host is one this test made.
const SETUP = { instance: "tz", cidr: "10.255.0.0/22" };
const config = testConfig(SETUP);
let running: RunningNodeAgent | undefined;

afterAll(async () => {
  await running?.stop({ killAll: true }).catch(() => undefined);
  await purgeAgent(config);
}, 120_000);

describe("node agent close({ killAll })", () => {
  it(
    "removes claimed sandboxes and instances no sandbox claims (a pooled one whose removal failed)",
    async () => {
      const before = hostFootprint(config);
      running = await startTestAgent(SETUP);
      await agentClient(running).create({ sandboxId: "closeclaimed", teamId: "team-a", templateId: "base" });
      // An instance the driver runs that no sandbox claims: what a pooled instance whose removal failed leaves.
      const template = await running.agent.ensureTemplate("base");
      const orphan = await running.driver.create({ template, resources: template.recipe.defaults });
      expect(running.driver.list().map((i) => i.instanceId)).toContain(orphan.instanceId);
      expect(hostFootprint(config).instances.length).toBe(before.instances.length + 2);

      await running.stop({ killAll: true });
      running = undefined;
      expect(hostFootprint(config)).toEqual(before);
    },
    BUILD_TIMEOUT_MS,
  );
});
