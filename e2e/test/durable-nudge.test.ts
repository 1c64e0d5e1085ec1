import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { Sandbox, Template } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// A pause is captured into the cluster's store right away: the master that paused it nudges the leader's durability
// pass (PostgreSQL LISTEN/NOTIFY, sent when the pause commits). The pass's own timer
// (WARREN_DURABILITY_INTERVAL_MS) is ten minutes here and its first turn ran when the master was elected, before any
// sandbox existed: only the nudge can make a pause durable within this test's waits.
const dataDir = mkdtempSync(join(tmpdir(), "warren-nudge-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "dn",
  nodeCidr: () => "10.221.0.0/22",
  env: { WARREN_DURABILITY_INTERVAL_MS: "600000" },
});
let env: ClusterEnv;

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

/** `durable` of the sandbox's detail once it is true; throws after `timeoutMs`. */
async function durableWithin(sandboxId: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const res = await fetch(`${env.E2B_API_URL}/sandboxes/${sandboxId}`, {
      headers: { "X-API-KEY": env.E2B_API_KEY },
    });
    const body = (await res.json()) as { state?: string; durable?: boolean };
    if (body.durable === true) return;
    if (Date.now() > deadline) throw new Error(`sandbox ${sandboxId} not durable: ${JSON.stringify(body)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The node agent's "snapshot published" log lines, oldest first. */
function publishedLines(): { snapshotId: string; base?: string; uploadedBytes: number; ownBytes: number }[] {
  return readFileSync(join(dataDir, "logs", "node-agent-dna.log"), "utf8")
    .split("\n")
    .filter((line) => line.includes('"snapshot published"'))
    .map((line) => JSON.parse(line));
}

describe("a pause nudges the durability pass", () => {
  it("each pause is durable long before the pass's next turn, and resumes with its files", async () => {
    const sandbox = await Sandbox.create({ timeoutMs: 300_000 });
    try {
      await sandbox.files.write("/home/user/kept.txt", "kept");
      for (let round = 1; round <= 2; round++) {
        expect(await sandbox.pause()).toBe(true);
        await durableWithin(sandbox.sandboxId, 90_000);
        await sandbox.connect();
        expect(await sandbox.files.read("/home/user/kept.txt")).toBe("kept");
      }
      // The second durable copy was packed against the first: it moved what changed, not the whole memory image.
      const published = publishedLines();
      expect(published).toHaveLength(2);
      const [first, second] = published as [(typeof published)[0], (typeof published)[0]];
      expect(first.base).toBeUndefined();
      expect(second.base).toBe(first.snapshotId);
      // With memory (CRIU here) the second moved the units that changed, a part of its memory image (how much of
      // it a resumed sandbox touches varies: 12–51 % seen here); files only, both parts are small.
      if (second.ownBytes > 2 ** 20) expect(second.uploadedBytes).toBeLessThan(0.8 * second.ownBytes);
    } finally {
      await sandbox.kill();
    }
  }, 300_000);

  it("a sandbox's first durable copy is packed against its template's ready snapshot", async () => {
    // A start command: the ready snapshot keeps memory where CRIU works, and the sandbox's memory begins as it.
    await Template.build(
      Template()
        .fromTemplate("base")
        .runCmd("head -c 3000000 /dev/urandom > /home/user/template.bin")
        .setStartCmd("sleep infinity", "true"),
      "nudge-packed",
    );
    const sandbox = await Sandbox.create("nudge-packed", { timeoutMs: 300_000 });
    try {
      expect(await sandbox.pause()).toBe(true);
      await durableWithin(sandbox.sandboxId, 90_000);
      const published = publishedLines();
      const copy = published.at(-1);
      // The ready snapshot was published by the build, before the sandbox's copy.
      const template = published.slice(0, -1).find((line) => line.snapshotId === copy?.base);
      expect(template).toBeDefined();
      // With memory, the units the sandbox changed since the template's snapshot, not its memory image.
      if (copy && copy.ownBytes > 2 ** 20) expect(copy.uploadedBytes).toBeLessThan(0.8 * copy.ownBytes);
    } finally {
      await sandbox.kill();
    }
  }, 300_000);
});
