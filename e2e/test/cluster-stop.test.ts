import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import { afterAll, expect, it } from "vitest";

// A local cluster's stop when a node agent does not end within its grace (a stalled machine once left a test's
// sandbox, its disk mounted under the cluster's data folder, behind a SIGKILLed agent): the agent is started once
// more, re-adopts what it left, and is stopped again, so nothing of the sandbox stays on the host.
const dataDir = mkdtempSync(join(tmpdir(), "warren-cluster-stop-"));
const INSTANCE = "ksa";
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "ks",
  nodeCidr: () => "10.203.0.0/22",
  stopGraceMs: 3_000,
});

afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

const netnsOfInstance = () =>
  execFileSync("ip", ["netns", "list"], { encoding: "utf8" })
    .split("\n")
    .filter((line) => line.startsWith(`warren-${INSTANCE}-`));
/** The host's firewall lines (filter and nat) naming the agent's chains: its chains and the jumps to them. */
const chainsOfInstance = () =>
  ["filter", "nat"].flatMap((table) =>
    execFileSync("iptables", ["-w", "-t", table, "-S"], { encoding: "utf8" })
      .split("\n")
      .filter((line) => line.includes(`WARREN-${INSTANCE.toUpperCase()}-`)),
  );
const mountsUnder = (dir: string) =>
  readFileSync("/proc/self/mounts", "utf8")
    .split("\n")
    .filter((line) => line.split(" ")[1]?.startsWith(dir));

it("a node agent SIGKILLed at stop is swept: its sandboxes' namespaces, mounts and firewall chains are gone afterwards", async () => {
  const env = await cluster.start();
  const sandbox = await Sandbox.create({
    apiKey: env.E2B_API_KEY,
    apiUrl: env.E2B_API_URL,
    sandboxUrl: env.E2B_SANDBOX_URL,
  });
  expect((await sandbox.commands.run("echo up")).stdout).toBe("up\n");
  expect(netnsOfInstance().length).toBeGreaterThan(0);
  expect(mountsUnder(dataDir).length).toBeGreaterThan(0);
  expect(chainsOfInstance().length).toBeGreaterThan(0);
  // A stalled agent: it cannot act on SIGTERM within the grace, so stop SIGKILLs it.
  const agent = cluster.nodeAgentChildren[0];
  const pid = agent?.child.pid as number;
  process.kill(pid, "SIGSTOP");
  await cluster.stop();
  expect(agent?.child.signalCode).toBe("SIGKILL");
  expect(existsSync(join(dataDir, "logs", `node-agent-${INSTANCE}-restarted.log`))).toBe(true);
  expect(netnsOfInstance()).toEqual([]);
  expect(mountsUnder(dataDir)).toEqual([]);
  // The agent's stop removed every sandbox, so its chains (and the jumps from INPUT, FORWARD, POSTROUTING) went too.
  expect(chainsOfInstance()).toEqual([]);
}, 600_000);
