import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";

// Test files run concurrently, and every node agent they start names its namespaces, veths, cgroups and firewall
// chains after its instance: two files whose agents share a name tear down each other's sandboxes (the node agent
// now refuses a name in use, control-plane/src/node-agent/instance-claim.ts, but only when the two overlap in
// time). This reads every test and benchmark for the instance names its agents take and asserts that no two
// files share one, so a clash fails here on every run instead of now and then in CI.
const ROOT = join(import.meta.dirname, "..", "..");
const SCANNED = ["e2e/test", "e2e/bench", "e2e/scripts", "sdk/test", "control-plane/test", "control-plane/bench"];

function* sources(dir: string): Generator<string> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* sources(path);
    else if (/\.(test\.ts|ts|mjs)$/.test(entry.name)) yield path;
  }
}

/** The instance names a file's agents take: explicit names, and a LocalCluster prefix + a, b, … per node agent. */
function instanceNames(text: string): string[] {
  const names = [...text.matchAll(/\binstance: "([a-z0-9]+)"/g)].map((m) => m[1] as string);
  const agents = Math.max(1, ...[...text.matchAll(/\bnodeAgents: (\d+)/g)].map((m) => Number(m[1])));
  const prefixes = [
    ...text.matchAll(/\binstancePrefix: "([a-z0-9]*)"/g),
    ...text.matchAll(/"--instance-prefix",\s*"([a-z0-9]+)"/g),
    ...text.matchAll(/"instance-prefix": \{[^}]*default: [^}]*"([a-z0-9]+)" \}/g),
  ].map((m) => m[1] as string);
  for (const prefix of prefixes) {
    for (let i = 0; i < agents; i++) names.push(`${prefix}${String.fromCharCode(97 + i)}`);
  }
  return [...new Set(names)];
}

describe("test instance names", () => {
  it("no two test or benchmark files start node agents under the same instance name", () => {
    const owners = new Map<string, string[]>();
    for (const dir of SCANNED) {
      for (const file of sources(join(ROOT, dir))) {
        for (const name of instanceNames(readFileSync(file, "utf8"))) {
          owners.set(name, [...(owners.get(name) ?? []), relative(ROOT, file)]);
        }
      }
    }
    // The scan finds the agents it must: a regression in it would pass vacuously.
    expect(owners.get("sca")).toEqual(["sdk/test/cluster.test.ts"]);
    expect(owners.get("bqa")).toEqual(["e2e/test/budgets.test.ts"]);
    expect(owners.size).toBeGreaterThan(50);
    const shared = [...owners].filter(([, files]) => files.length > 1);
    expect(shared).toEqual([]);
  });
});
