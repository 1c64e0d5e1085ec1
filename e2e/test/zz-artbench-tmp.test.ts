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
    await sbx.commands.run("mkdir -p /tmp/b && head -c 104857600 /dev/urandom > /tmp/b/r.bin && for i in $(seq 1 2000); do echo file $i > /tmp/b/f$i.txt; done", { user: "root" });
    for (const format of ["tar", "zip", "tar"] as const) {
      const t0 = performance.now();
      const a = await sbx.artifacts.publish("/tmp/b", { format });
      const t1 = performance.now();
      const bytes = await sbx.artifacts.download(a.artifactId);
      const t2 = performance.now();
      console.log(`FIGURE ${format} size=${a.sizeBytes} publish=${Math.round(t1 - t0)}ms download=${Math.round(t2 - t1)}ms len=${bytes.byteLength}`);
    }
    await sbx.kill();
  } finally {
    await cluster.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
}, 900_000);
