#!/usr/bin/env node
// What the guest CRNG reseed adds to a microVM restore: the clock line the driver sends after every restore,
// without and with the seed (guest-image.ts), side by side on one running guest, samples interleaved (TCG).
// Prints figures, asserts nothing. Run as root after `npm run build`: `node control-plane/bench/microvm-reseed.mjs`.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { loadNodeAgentConfig } from "../dist/node-agent/config.js";
import { createLogger } from "../dist/node-agent/log.js";
import { MicrovmDriver } from "../dist/runtime/microvm/driver.js";
import { syncGuestClock } from "../dist/runtime/microvm/qemu.js";
import { TemplateStore } from "../dist/templates/store.js";

const config = loadNodeAgentConfig({
  WARREN_STATE_DIR: "/var/lib/warren/bench-reseed",
  WARREN_INSTANCE: "brs",
  WARREN_NET_CIDR: "10.237.32.0/24",
  WARREN_LOG_LEVEL: "warn",
});
const log = createLogger("bench", { level: "warn" });
const templates = new TemplateStore({ dir: config.templatesDir, uidBase: config.uidBase, log });
const template = templates.ready("base");
const driver = new MicrovmDriver({
  stateDir: config.stateDir,
  instance: "brs",
  netCidr: "10.237.32.0/24",
  accel: "tcg",
  imageDir: config.microvmDir,
  linuxDir: config.microvmKernel,
  nodeBinary: config.nodeBinary,
  envdRoot: config.envdRoot,
  uidBase: config.uidBase,
  readyTimeoutMs: 120000,
  uplinkForwarding: false,
  log,
});
await driver.start();
await driver.reconcile();
for (const i of driver.list()) await driver.kill(i.instanceId);
const instance = await driver.create({ template, resources: template.recipe.defaults });
const consolePath = join(driver.instanceDir(instance.instanceId), "console.sock");
const plain = [],
  seeded = [],
  outcomes = new Set();
for (let i = 0; i < 15; i++) {
  let t = performance.now();
  await syncGuestClock(consolePath, 20000);
  plain.push(performance.now() - t);
  t = performance.now();
  outcomes.add(await syncGuestClock(consolePath, 20000, randomBytes(32)));
  seeded.push(performance.now() - t);
}
const med = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)].toFixed(1);
console.log(
  `clock only: median ${med(plain)} ms; clock + reseed: median ${med(seeded)} ms (n=15 each, interleaved, TCG); guest said: ${[...outcomes].join(",")}`,
);
await driver.kill(instance.instanceId);
await driver.close();
