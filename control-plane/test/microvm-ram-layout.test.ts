import { readFileSync, statSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { initEnvd } from "../src/node-agent/envd-client.js";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { type BuiltTemplate, TemplateStore } from "../src/templates/store.js";
import { BUILD_TIMEOUT_MS, sdkSandbox, testConfig } from "./node-agent-harness.js";

// The two layouts of a template snapshot's guest RAM (qemu.ts `ramArgs`), driven directly under TCG: in a file the
// restored VMs map copy-on-write (the default), and in the migration stream (WARREN_MICROVM_RAM_FILE=0). Either
// way a sandbox runs, pauses to disk and comes back with its processes.
const LAYOUTS = [
  { name: "file", env: {}, config: { instance: "mr", cidr: "10.245.0.0/24" } },
  { name: "stream", env: { WARREN_MICROVM_RAM_FILE: "0" }, config: { instance: "mq", cidr: "10.245.4.0/24" } },
] as const;
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
const drivers = new Map<string, MicrovmDriver>();
let template: BuiltTemplate;

async function newDriver(layout: (typeof LAYOUTS)[number]): Promise<MicrovmDriver> {
  const config = testConfig({
    ...layout.config,
    extraEnv: { WARREN_DRIVER: "microvm-tcg", ...layout.env },
  });
  const { microvm } = await selectRuntime(config, log);
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  await microvm.start();
  for (const instance of (await microvm.reconcile()).adopted) await microvm.kill(instance.instanceId);
  return microvm;
}

/** The QEMU's mapping of a file named `ram` (its smaps line), if any. */
function ramMapping(pid: number): string | undefined {
  return readFileSync(`/proc/${pid}/smaps`, "utf8")
    .split("\n")
    .find((line) => /^[0-9a-f]+-[0-9a-f]+ \S+ .* \/\S+\/ram$/.test(line));
}

beforeAll(async () => {
  for (const layout of LAYOUTS) drivers.set(layout.name, await newDriver(layout));
  const config = testConfig({ ...LAYOUTS[0].config });
  const templates = new TemplateStore({ dir: config.templatesDir, uidBase: config.uidBase, log });
  // The template's ready check (when this file builds it): a sandbox of it starts.
  template = await templates.ensure("base", async (image) => {
    const driver = drivers.get("file")!;
    const instance = await driver.create({ template: image, resources: templates.recipe("base").defaults });
    await driver.kill(instance.instanceId);
  });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const driver of drivers.values()) {
    for (const instance of driver.list()) await driver.kill(instance.instanceId).catch(() => undefined);
    await driver.close();
  }
}, 120_000);

describe("a template snapshot's guest RAM: in a file mapped copy-on-write, or in the stream", () => {
  for (const layout of LAYOUTS) {
    it(`${layout.name}: the template snapshot, a sandbox restored from it, its checkpoint and resume`, async () => {
      const driver = drivers.get(layout.name)!;
      const snapshot = await driver.ensureSnapshot(template, template.recipe.defaults);
      const stream = statSync(snapshot.memory).size;
      if (layout.name === "file") {
        // RAM in its own file; the stream is device state only.
        expect(snapshot.ram).toBeDefined();
        expect(statSync(snapshot.ram!).size).toBe(template.recipe.defaults.memoryMB * 2 ** 20);
        expect(stream).toBeLessThan(2 ** 20);
      } else {
        expect(snapshot.ram).toBeUndefined();
        expect(stream).toBeGreaterThan(16 * 2 ** 20);
      }

      const instance = await driver.create({ template, resources: template.recipe.defaults });
      await initEnvd(instance.envdUrl, {
        envVars: {},
        accessToken: "token-ram",
        defaultUser: "user",
        defaultWorkdir: "/home/user",
      });
      const pidFile = `${driver.instanceDir(instance.instanceId)}/qemu.pid`;
      const qemu = Number(readFileSync(pidFile, "utf8"));
      const mapping = ramMapping(qemu);
      if (layout.name === "file") {
        // Private (copy-on-write) mapping of the template's RAM file.
        expect(mapping?.split(/\s+/)[1]).toBe("rw-p");
        expect(mapping?.endsWith(`${snapshot.dir}/ram`)).toBe(true);
      } else {
        expect(mapping).toBeUndefined();
      }
      const sandbox = sdkSandbox(instance.instanceId, instance.envdUrl, "token-ram");
      const sleeper = await sandbox.commands.run("sleep 100000", { background: true });
      await sandbox.files.write("/home/user/layout.txt", layout.name);

      // Paused to disk and back: all of its memory went into the checkpoint (its RAM is private either way), and
      // the QEMU restored from it runs on ordinary memory.
      await driver.pause(instance.instanceId);
      const checkpoint = await driver.checkpoint(instance.instanceId);
      expect(checkpoint.imageBytes).toBeGreaterThan(16 * 2 ** 20);
      await driver.resume(instance.instanceId);
      const restored = Number(readFileSync(pidFile, "utf8"));
      expect(restored).not.toBe(qemu);
      expect(ramMapping(restored)).toBeUndefined();
      const after = sdkSandbox(instance.instanceId, instance.envdUrl, "token-ram");
      const alive = await after.commands.run(`cat /proc/${sleeper.pid}/cmdline | tr '\\0' ' '`);
      expect(alive.stdout.trim()).toBe("sleep 100000");
      expect(await after.files.read("/home/user/layout.txt")).toBe(layout.name);
      await driver.kill(instance.instanceId);
    }, 600_000);
  }
});
