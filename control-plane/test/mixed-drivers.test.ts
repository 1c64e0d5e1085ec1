import { execFileSync } from "node:child_process";
import { routeKey } from "@warren/proto/redis";
import type { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import { type RunningNodeAgent, startNodeAgent } from "../src/node-agent/node-agent.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { healthy } from "../src/runtime/sandbox-process.js";
import {
  agentClient,
  BUILD_TIMEOUT_MS,
  purgeAgent,
  sdkSandbox,
  startTestAgent,
  testConfig,
} from "./node-agent-harness.js";

/**
 * One host, two node agents of different drivers (a microVM agent under TCG and a namespace agent), as a platform
 * team mixing isolation levels would run them. The microVM agent starts first, so the namespace agent's chains
 * come first in FORWARD: a sandbox of one driver must not reach the other's, whichever chain decides first.
 * Traffic goes only between the two sandboxes' own addresses and from the host to them.
 */
const VM_SETUP = {
  instance: "mx",
  cidr: "10.243.0.0/24",
  extraEnv: { WARREN_DRIVER: "microvm-tcg", WARREN_CHECKPOINT_AFTER_MS: "600000" },
};
const NS_SETUP = { instance: "nx", cidr: "10.243.4.0/24" };
const vmConfig = testConfig(VM_SETUP);
const nsConfig = testConfig(NS_SETUP);
const redis = new Redis(vmConfig.redisUrl);
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
let vmAgent: RunningNodeAgent<MicrovmDriver>;
let nsAgent: RunningNodeAgent;
/** Sandboxes to kill at the end, by the agent that runs them then (agents are restarted below). */
const sandboxes: { kind: "vm" | "ns"; id: string }[] = [];

async function startVmAgent(): Promise<RunningNodeAgent<MicrovmDriver>> {
  const { microvm } = await selectRuntime(vmConfig, log);
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  return startNodeAgent(vmConfig, log, microvm);
}

async function purgeVm(): Promise<void> {
  const { microvm } = await selectRuntime(vmConfig, silentLogger);
  if (!microvm) return;
  await microvm.start();
  try {
    const { adopted, removed } = await microvm.reconcile();
    for (const instance of adopted) {
      await microvm.kill(instance.instanceId);
      if (instance.labels.sandboxId) await redis.del(routeKey(instance.labels.sandboxId));
    }
    for (const r of removed) if (r.labels.sandboxId) await redis.del(routeKey(r.labels.sandboxId));
  } finally {
    await microvm.close();
  }
}

async function create(kind: "vm" | "ns", sandboxId: string, allowOut: string[]) {
  const placement = await agentClient(kind === "vm" ? vmAgent : nsAgent).create({
    sandboxId,
    teamId: "team-mixed",
    templateId: "base",
    envdAccessToken: `token-${sandboxId}`,
    egress: { allowOut, denyOut: [] },
  });
  sandboxes.push({ kind, id: sandboxId });
  return { addr: placement.sandboxAddr, sandbox: sdkSandbox(sandboxId, placement.envdUrl, `token-${sandboxId}`) };
}

/** curl from inside a sandbox: its exit code (0: an answer came). */
async function curlFrom(sandbox: Sandbox, url: string): Promise<number> {
  const result = await sandbox.commands.run(`curl -sS -m 3 -o /dev/null '${url}'; echo "rc=$?"`, {
    timeoutMs: 60_000,
  });
  return Number(/rc=(\d+)/.exec(result.stdout)?.[1] ?? -1);
}

function hostRules(chain: string): string {
  return execFileSync("iptables", ["-w", "-S", chain], { encoding: "utf8" });
}

beforeAll(async () => {
  await purgeVm();
  await purgeAgent(nsConfig);
  vmAgent = await startVmAgent();
  await vmAgent.agent.ensureTemplate("base");
  nsAgent = await startTestAgent(NS_SETUP);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const { kind, id } of sandboxes) {
    const running = kind === "vm" ? vmAgent : nsAgent;
    if (running)
      await agentClient(running)
        .kill({ sandboxId: id })
        .catch(() => undefined);
  }
  await nsAgent?.stop({ killAll: true });
  await vmAgent?.stop({ killAll: true });
  await purgeAgent(nsConfig);
  await purgeVm();
  redis.disconnect();
}, 180_000);

describe("a namespace agent and a microVM agent on one host", () => {
  let vm: Awaited<ReturnType<typeof create>>;
  let ns: Awaited<ReturnType<typeof create>>;

  it("both run their sandboxes, and the host reaches each", async () => {
    // Each sandbox's own policy lets it out to the other agent's whole network (a private range, closed by
    // default): only the host's rules stand between them, which is what this file tests.
    vm = await create("vm", "mxvm", [NS_SETUP.cidr]);
    ns = await create("ns", "nxns", [VM_SETUP.cidr]);
    expect((await vm.sandbox.commands.run("uname -r")).stdout.trim()).toMatch(/-cloud-amd64$/);
    expect((await ns.sandbox.commands.run("echo namespace")).stdout.trim()).toBe("namespace");
    expect(await healthy(vm.addr, 2000)).toBe(true);
    expect(await healthy(ns.addr, 2000)).toBe(true);
    // The namespace agent's FORWARD chain is consulted before the microVM agent's (it started last).
    const forward = execFileSync("iptables", ["-w", "-S", "FORWARD"], { encoding: "utf8" });
    const nsJump = forward.indexOf(`-j ${nsAgent.driver.network.forwardChain}`);
    const vmJump = forward.indexOf(`-j ${vmAgent.driver.network.forwardChain}`);
    expect(nsJump).toBeGreaterThanOrEqual(0);
    expect(vmJump).toBeGreaterThan(nsJump);
  }, 240_000);

  it("neither driver's sandbox reaches the other's (any port), whichever agent's chain decides first", async () => {
    // The namespace agent's rules for a sandbox veth accept what it sends with its address, after dropping what
    // goes to any sandbox veth of either driver (without the microVM's `wv-+` there, this first request got an
    // answer: the microVM's namespace forwards whatever the node sends it).
    expect(await curlFrom(ns.sandbox, `http://${vm.addr}:49983/health`)).not.toBe(0);
    expect(await curlFrom(ns.sandbox, `http://${vm.addr}:22/`)).not.toBe(0);
    expect(await curlFrom(vm.sandbox, `http://${ns.addr}:49983/health`)).not.toBe(0);
    // Each sandbox still reaches its own envd (the tool works, the target was up all along).
    expect(await curlFrom(ns.sandbox, "http://127.0.0.1:49983/health")).toBe(0);
    expect(await healthy(vm.addr, 2000)).toBe(true);
    const nsChain = hostRules(nsAgent.driver.network.forwardChain);
    for (const iface of ["wr-+", "wv-+"]) expect(nsChain).toContain(`-o ${iface} `);
    const vmChain = hostRules(vmAgent.driver.network.forwardChain);
    for (const iface of ["wr-+", "wv-+"]) expect(vmChain).toContain(`-o ${iface} -j DROP`);
  }, 240_000);

  it("each agent's restart and clean-up leaves the other driver's sandboxes alone", async () => {
    // A restarted namespace agent sweeps what it does not own: namespaces, veths, cgroups, rules of its own tag.
    await nsAgent.stop();
    nsAgent = await startNodeAgent(nsConfig, log);
    expect(nsAgent.agent.get("nxns")).toBeDefined();
    expect((await vm.sandbox.commands.run("echo still here")).stdout.trim()).toBe("still here");
    // And a restarted microVM agent leaves the namespace sandbox be.
    await vmAgent.stop();
    vmAgent = await startVmAgent();
    expect(vmAgent.agent.get("mxvm")).toBeDefined();
    expect((await ns.sandbox.commands.run("echo still here")).stdout.trim()).toBe("still here");
    expect((await vm.sandbox.commands.run("echo back")).stdout.trim()).toBe("back");
  }, 240_000);
});
