import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Code, ConnectError } from "@connectrpc/connect";
import { routeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  agentClient,
  BUILD_TIMEOUT_MS,
  hostFootprint,
  purgeAgent,
  sdkSandbox,
  startTestAgent,
  testConfig,
} from "./node-agent-harness.js";

/**
 * The agent as its own process (the built entry point), killed with SIGKILL while sandboxes run, then restarted:
 * live sandboxes are re-adopted, a sandbox that died meanwhile is removed with its route, the previous agent's
 * warm sandboxes are replaced, and nothing is left behind.
 */
const SETUP = { instance: "tc", cidr: "10.210.8.0/22", poolSize: 1, netPoolSize: 1 };
const config = testConfig(SETUP);
const MAIN = fileURLToPath(new URL("../dist/node-agent/main.js", import.meta.url));
const redis = new Redis(config.redisUrl);

interface AgentProcess {
  child: ChildProcess;
  port: number;
  logs: () => string;
}

function agentEnv(): Record<string, string> {
  return {
    PATH: process.env.PATH ?? "/usr/sbin:/usr/bin:/sbin:/bin",
    WARREN_NODE_ID: config.nodeId,
    WARREN_AGENT_LISTEN: "127.0.0.1:0",
    WARREN_STATE_DIR: config.stateDir,
    WARREN_TEMPLATES_DIR: config.templatesDir,
    WARREN_INSTANCE: config.instance,
    WARREN_NET_CIDR: config.netCidr,
    WARREN_POOL_SIZE: String(SETUP.poolSize),
    // The pool stays at its floor: the footprint below counts exactly one warm sandbox (demand would grow it).
    WARREN_POOL_MAX: String(SETUP.poolSize),
    WARREN_NET_POOL_SIZE: String(SETUP.netPoolSize),
    WARREN_PREBUILD_TEMPLATES: "base",
    WARREN_HEARTBEAT_MS: "500",
  };
}

async function startAgentProcess(): Promise<AgentProcess> {
  const child = spawn(process.execPath, [MAIN], { env: agentEnv(), stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`agent did not start: ${stderr}`)), 60_000);
    child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
      stderr += chunk;
      const match = /"msg":"node agent listening".*"port":(\d+)/.exec(stderr);
      if (match?.[1]) {
        clearTimeout(timer);
        resolve(Number(match[1]));
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`agent exited with ${code}: ${stderr}`));
    });
  });
  return { child, port, logs: () => stderr };
}

async function waitForPool(client: ReturnType<typeof agentClient>): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const info = await client.info({});
    if ((info.pools.base ?? 0) >= 1) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error("warm pool did not fill");
}

let agent: AgentProcess | undefined;

beforeAll(async () => {
  // Builds `base` if no other file has yet (shared, locked cache), and clears leftovers of this tag.
  const running = await startTestAgent(SETUP);
  await running.stop({ killAll: true });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  if (agent?.child.exitCode === null) {
    const exited = new Promise((resolve) => agent?.child.once("exit", resolve));
    agent.child.kill("SIGKILL");
    await exited;
  }
  await purgeAgent(config);
  await redis.del(routeKey("restartlive"), routeKey("restartdead"));
  redis.disconnect();
}, 240_000);

describe("agent crash and restart", { timeout: 180_000 }, () => {
  it("after kill -9 and a restart, live sandboxes are re-adopted, dead ones removed, and nothing is left behind", async () => {
    agent = await startAgentProcess();
    let client = agentClient(agent);
    await waitForPool(client);
    const live = await client.create({ sandboxId: "restartlive", templateId: "base", envdAccessToken: "tok-live" });
    expect(live.pooled).toBe(true);
    const dead = await client.create({ sandboxId: "restartdead", templateId: "base", envdAccessToken: "tok-dead" });
    const sandbox = sdkSandbox("restartlive", live.envdUrl, "tok-live");
    await sandbox.files.write("/home/user/before-crash.txt", "still here");
    await waitForPool(client);

    // Crash the agent, and kill one sandbox's processes while no agent is watching.
    const exited = new Promise((resolve) => agent?.child.once("exit", resolve));
    agent.child.kill("SIGKILL");
    await exited;
    expect(await redis.exists(routeKey("restartlive"))).toBe(1);
    const listed = hostFootprint(config);
    expect(listed.instances.length).toBe(3); // live, dead, and one warm sandbox
    const deadDir = `${config.stateDir}/instances`;
    const { readFileSync, readdirSync } = await import("node:fs");
    for (const id of readdirSync(deadDir)) {
      const record = JSON.parse(readFileSync(`${deadDir}/${id}/instance.json`, "utf8")) as {
        pid: number;
        labels: Record<string, string>;
      };
      if (record.labels.sandboxId === "restartdead") process.kill(record.pid, "SIGKILL");
    }

    // Leftovers of a create that crashed halfway, with no record on disk: a netns + veth + firewall rule of a
    // slot, cgroups, and a mounted writable layer in an instance directory without instance.json.
    const sh = (script: string) => execFileSync("sh", ["-c", script], { encoding: "utf8" });
    sh(`ip netns add warren-tc-200 && ip link add wr-tc-200 type veth peer name wr-tc-200p netns warren-tc-200`);
    sh(`iptables -w -A WARREN-TC-IN -i wr-tc-200 -m comment --comment warren:tc:200 -j DROP`);
    sh(`for c in memory cpu cpuacct pids freezer; do mkdir -p /sys/fs/cgroup/$c/warren/tc/iorphan; done`);
    sh(
      `mkdir -p ${deadDir}/iorphan/disk && mkfs.ext4 -q ${deadDir}/iorphan/disk.img 64M && mount -o loop ${deadDir}/iorphan/disk.img ${deadDir}/iorphan/disk`,
    );
    expect(hostFootprint(config).netns).toContain("warren-tc-200");

    agent = await startAgentProcess();
    client = agentClient(agent);
    const list = await client.list({});
    expect(list.sandboxes.map((s) => s.sandboxId)).toEqual(["restartlive"]);
    const swept = hostFootprint(config);
    expect(swept.netns).not.toContain("warren-tc-200");
    expect(swept.veths).not.toContain("wr-tc-200");
    expect(swept.rules.filter((rule) => rule.includes('"warren:tc:200"'))).toEqual([]);
    expect(swept.cgroups).not.toContain("iorphan");
    expect(swept.instances).not.toContain("iorphan");
    expect(swept.mounts.filter((point) => point.includes("iorphan"))).toEqual([]);
    expect(swept.loops.filter((file) => file.includes("iorphan"))).toEqual([]);
    expect(list.sandboxes[0]?.exec).toBe(live.exec);
    // The adopted sandbox still works, with its files and its route.
    expect(await sandbox.files.read("/home/user/before-crash.txt")).toBe("still here");
    expect((await sandbox.commands.run("id -un")).stdout.trim()).toBe("user");
    expect(await redis.hget(routeKey("restartlive"), "exec")).toBe(live.exec);
    // The dead one is gone, route included.
    expect(await redis.exists(routeKey("restartdead"))).toBe(0);
    await expect(client.kill({ sandboxId: "restartdead" })).rejects.toSatisfy(
      (error: unknown) => ConnectError.from(error).code === Code.NotFound,
    );
    expect(agent.logs()).toContain("removing dead sandbox instance found at start");
    // Structured logs, and no access token in them.
    expect(agent.logs()).not.toMatch(/tok-live|tok-dead/);
    for (const line of agent.logs().trim().split("\n")) expect(() => JSON.parse(line)).not.toThrow();
    void dead;

    // Killing the survivor and stopping the agent leaves nothing of this agent on the host.
    await client.kill({ sandboxId: "restartlive" });
    expect(await redis.exists(routeKey("restartlive"))).toBe(0);
    const stopped = new Promise((resolve) => agent?.child.once("exit", resolve));
    agent.child.kill("SIGTERM");
    expect(await stopped).toBe(0);
    const after = hostFootprint(config);
    // The ready disks went with the agent.
    expect(readFileSync("/proc/self/mountinfo", "utf8")).not.toContain(`${config.stateDir}/disks/`);
    expect(after).toEqual({
      instances: [],
      cgroups: [],
      netns: [],
      veths: [],
      crun: [],
      loops: [],
      mounts: [],
      rules: [],
    });
  });
});
