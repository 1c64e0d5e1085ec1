import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox as WarrenSandbox } from "@warren/sdk";
import { it } from "vitest";
import { LocalCluster } from "../src/cluster.js";

it("bench", async () => {
  const dataDir = mkdtempSync(join(tmpdir(), "warren-artbench-"));
  const cluster = new LocalCluster({ dataDir, nodeAgents: 1, poolSize: 1, instancePrefix: "j", nodeCidr: () => "10.252.0.0/22" });
  const env = await cluster.start();
  Object.assign(process.env, { E2B_API_URL: env.E2B_API_URL, E2B_SANDBOX_URL: env.E2B_SANDBOX_URL, E2B_API_KEY: env.E2B_API_KEY });
  try {
    const sbx = await WarrenSandbox.create("base", { timeoutMs: 600_000 });
    await sbx.commands.run("mkdir -p /tmp/b && head -c 52428800 /dev/urandom > /tmp/b/r.bin", { user: "root" });
    let n = 0;
    let t0 = performance.now();
    await sbx.commands.run("cat /tmp/b/r.bin", { user: "root", onStdout: () => {}, timeoutMs: 0 } as never).catch((e) => console.log("ERR", String(e)));
    console.log(`FIGURE envd-direct cat 50MB ${Math.round(performance.now() - t0)}ms`);
    t0 = performance.now();
    const a = await sbx.artifacts.publish("/tmp/b/r.bin");
    console.log(`FIGURE publish 50MB ${Math.round(performance.now() - t0)}ms size=${a.sizeBytes} ${n}`);
    await sbx.kill();
  } finally {
    await cluster.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}, 900_000);
