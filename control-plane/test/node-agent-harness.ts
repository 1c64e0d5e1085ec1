import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { NodeAgentService } from "@warren/proto/nodeagent/v1/node_agent_pb";
import { isSandboxId, routeKey } from "@warren/proto/redis";
import { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { loadNodeAgentConfig, type NodeAgentConfig } from "../src/node-agent/config.js";
import { createLogger, silentLogger } from "../src/node-agent/log.js";
import { type RunningNodeAgent, startNodeAgent } from "../src/node-agent/node-agent.js";
import { NamespaceDriver } from "../src/runtime/namespace/driver.js";

export const TEMPLATES_DIR = "/var/lib/warren/templates";
/**
 * Template builds take minutes on a fresh machine (the template builder's debootstrap); vitest's global setup makes
 * the shipped ones first (e2e/src/prebuild-shipped-templates.ts), but a file may still wait for a store's copy.
 */
export const BUILD_TIMEOUT_MS = 600_000;

/** Each test file has its own agent tag and address range, so files can run side by side on one host. */
export interface TestAgentSetup {
  readonly instance: string;
  readonly cidr: string;
  readonly poolSize?: number;
  readonly netPoolSize?: number;
  readonly extraEnv?: Record<string, string>;
}

export function testConfig(setup: TestAgentSetup): NodeAgentConfig {
  return loadNodeAgentConfig({
    WARREN_NODE_ID: `test-${setup.instance}`,
    WARREN_AGENT_LISTEN: "127.0.0.1:0",
    WARREN_STATE_DIR: `/var/lib/warren/test-${setup.instance}`,
    WARREN_TEMPLATES_DIR: TEMPLATES_DIR,
    WARREN_INSTANCE: setup.instance,
    WARREN_NET_CIDR: setup.cidr,
    WARREN_POOL_SIZE: String(setup.poolSize ?? 0),
    WARREN_NET_POOL_SIZE: String(setup.netPoolSize ?? 0),
    WARREN_PREBUILD_TEMPLATES: "",
    WARREN_HEARTBEAT_MS: "500",
    // Tests never change the host's uplink; their "internet" is a namespace of their own (e2e/src/outside-world.ts).
    WARREN_UPLINK_FORWARDING: "0",
    WARREN_DNS_UPSTREAM: "127.0.0.1:9",
    WARREN_LOG_LEVEL: process.env.WARREN_TEST_LOG ? "debug" : "warn",
    ...setup.extraEnv,
  });
}

/** Starts an in-process node agent and waits until the `base` template is built and ready. */
export async function startTestAgent(setup: TestAgentSetup): Promise<RunningNodeAgent> {
  const config = testConfig(setup);
  await purgeAgent(config);
  const log = process.env.WARREN_TEST_LOG
    ? createLogger("node-agent", { level: "debug" })
    : createLogger("node-agent", { level: "warn" });
  const running = await startNodeAgent(config, log);
  // Without a master nothing makes `base` for this agent: it comes from the host's cache, or a store's copy.
  if (!config.shareShippedTemplates && !running.templates.ready("base")) {
    await running.stop({ killAll: true });
    throw new Error(
      `${config.templatesDir} lacks \`base\`: vitest's global setup makes it (e2e/src/prebuild-shipped-templates.ts)`,
    );
  }
  await running.agent.ensureTemplate("base");
  return running;
}

/**
 * Safety net for afterAll: whatever a failed test left (sandboxes, pooled instances, namespaces, rules, routes)
 * of this agent tag is removed, by re-adopting it all with a fresh driver and killing it.
 */
export async function purgeAgent(config: NodeAgentConfig): Promise<void> {
  const driver = new NamespaceDriver({
    stateDir: config.stateDir,
    instance: config.instance,
    netCidr: config.netCidr,
    netPoolSize: 0,
    uidBase: config.uidBase,
    nodeBinary: config.nodeBinary,
    envdRoot: config.envdRoot,
    readyTimeoutMs: config.readyTimeoutMs,
    log: silentLogger,
  });
  await driver.start();
  const { adopted, removed } = await driver.reconcile();
  const redis = new Redis(config.redisUrl);
  try {
    const dropRoute = async (sandboxId: string | undefined) => {
      if (sandboxId && isSandboxId(sandboxId)) await redis.del(routeKey(sandboxId));
    };
    for (const instance of adopted) {
      await driver.kill(instance.instanceId);
      await dropRoute(instance.labels.sandboxId);
    }
    for (const r of removed) await dropRoute(r.labels.sandboxId);
  } finally {
    await driver.close();
    redis.disconnect();
  }
}

/** Polls `probe` every 100 ms until it gives a value; fails naming `what` after `timeoutMs`. */
export async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined> | T | undefined) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

export function agentClient(running: { port: number }) {
  return createClient(
    NodeAgentService,
    createConnectTransport({ baseUrl: `http://127.0.0.1:${running.port}`, httpVersion: "1.1" }),
  );
}

/** The official e2b SDK bound to a sandbox's envd, as the SDK's own create/connect would bind it. */
export function sdkSandbox(sandboxId: string, envdUrl: string, accessToken?: string): Sandbox {
  const SandboxClass = Sandbox as unknown as new (opts: Record<string, unknown>) => Sandbox;
  return new SandboxClass({
    sandboxId,
    envdVersion: "0.6.4",
    envdAccessToken: accessToken,
    sandboxUrl: envdUrl,
    debug: true,
  });
}

/** Slot index of a sandbox address inside the agent's CIDR (host .1, sandbox .2 of each /30). */
export function slotOf(cidr: string, addr: string): number {
  const toInt = (ip: string) => ip.split(".").reduce((n, o) => n * 256 + Number(o), 0);
  return (toInt(addr) - toInt(cidr.split("/")[0]!)) >> 2;
}

export interface Traces {
  readonly mounts: string[];
  readonly cgroups: string[];
  readonly netns: boolean;
  readonly veth: boolean;
  readonly rules: string[];
  readonly route: boolean;
  readonly files: boolean;
  readonly crunState: boolean;
}

/** Everything a sandbox could leave on the host, looked up directly in the kernel, filesystem and Redis. */
export async function tracesOf(
  config: NodeAgentConfig,
  sandbox: { sandboxId: string; instanceId: string; slot: number },
  redis: Redis,
): Promise<Traces> {
  const dir = `${config.stateDir}/instances/${sandbox.instanceId}`;
  const mounts = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .filter((line) => line.includes(dir));
  const cgroups = ["memory", "cpu", "cpuacct", "pids", "freezer", "unified"]
    .map((c) => `/sys/fs/cgroup/${c}/warren/${config.instance}/${sandbox.instanceId}`)
    .filter((path) => existsSync(path));
  const rules = execFileSync("iptables", ["-w", "-S"], { encoding: "utf8" })
    .split("\n")
    .filter((line) => line.includes(`"warren:${config.instance}:${sandbox.slot}"`));
  return {
    mounts,
    cgroups,
    netns: existsSync(`/run/netns/warren-${config.instance}-${sandbox.slot}`),
    veth: existsSync(`/sys/class/net/wr-${config.instance}-${sandbox.slot}`),
    rules,
    route: (await redis.exists(routeKey(sandbox.sandboxId))) === 1,
    files: existsSync(dir),
    crunState: existsSync(`${config.stateDir}/crun/warren-${config.instance}-${sandbox.instanceId}`),
  };
}

export const NO_TRACES: Traces = {
  mounts: [],
  cgroups: [],
  netns: false,
  veth: false,
  rules: [],
  route: false,
  files: false,
  crunState: false,
};

/**
 * The traces once a killed sandbox's background reclaim is over (a kill resolves when the sandbox is unreachable and
 * stopped; its host resources follow within ~100 ms): polled until none is left, or the last look after 10 s.
 */
export async function tracesAfterReclaim(
  config: NodeAgentConfig,
  sandbox: { sandboxId: string; instanceId: string; slot: number },
  redis: Redis,
): Promise<Traces> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const traces = await tracesOf(config, sandbox, redis);
    if (JSON.stringify(traces) === JSON.stringify(NO_TRACES) || Date.now() > deadline) return traces;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Names of everything this agent tag currently has on the host (for "nothing left behind" checks). */
export function hostFootprint(config: NodeAgentConfig): Record<string, string[]> {
  // Ready disks are the node's own (sandbox-disks.ts), made ahead for creates like the network pool's slots.
  const readyDisks = `${config.stateDir}/disks/ready/`;
  const list = (dir: string, prefix = "") =>
    existsSync(dir)
      ? readdirSync(dir)
          .filter((name) => name.startsWith(prefix))
          .sort()
      : [];
  return {
    instances: list(`${config.stateDir}/instances`),
    cgroups: list(`/sys/fs/cgroup/pids/warren/${config.instance}`).filter((name) => name.startsWith("i")),
    netns: list("/run/netns", `warren-${config.instance}-`),
    veths: list("/sys/class/net", `wr-${config.instance}-`),
    crun: list(`${config.stateDir}/crun`, "warren-"),
    // Loop devices of sandbox disks (sandbox-disks.ts) are freed when their mount goes.
    loops: execFileSync("losetup", ["--list", "--noheadings", "--output", "BACK-FILE"], { encoding: "utf8" })
      .split("\n")
      .map((line) => line.trim())
      .filter((file) => file.startsWith(`${config.stateDir}/`) && !file.startsWith(readyDisks))
      .sort(),
    mounts: readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .map((line) => line.split(" ")[4] ?? "")
      .filter((point) => point.startsWith(`${config.stateDir}/`) && !point.startsWith(readyDisks))
      .sort(),
    rules: execFileSync("iptables", ["-w", "-S"], { encoding: "utf8" })
      .split("\n")
      .filter((line) => line.includes(`"warren:${config.instance}:`))
      .sort(),
  };
}
