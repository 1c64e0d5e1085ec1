import { routeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NodeAgentConfig } from "../src/node-agent/config.js";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import { type RunningNodeAgent, startNodeAgent } from "../src/node-agent/node-agent.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { agentClient, BUILD_TIMEOUT_MS, sdkSandbox, testConfig } from "./node-agent-harness.js";

// The code gateway inside microVM guests (TCG). The template's ready check under this driver builds its root image
// (template root + node + envd + the code gateway and its packages) and its snapshot, taken once envd and the
// gateway both answer; the first run takes minutes under TCG.
const SETUP = {
  instance: "mc",
  cidr: "10.239.2.0/23",
  extraEnv: { WARREN_DRIVER: "microvm-tcg" },
};
const config = testConfig(SETUP);
const redis = new Redis(config.redisUrl);
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
const TEMPLATE = "code-interpreter-v1";
let running: RunningNodeAgent<MicrovmDriver>;
let client: ReturnType<typeof agentClient>;
const created = new Set<string>();

/** Whatever a failed run left of this agent tag (VMs, namespaces, files, routes) is removed. */
async function purge(cfg: NodeAgentConfig): Promise<void> {
  const { microvm } = await selectRuntime(cfg, silentLogger);
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

interface OutputLine {
  readonly type: string;
  readonly text?: string;
  readonly is_main_result?: boolean;
  readonly name?: string;
}

async function execute(gatewayUrl: URL, token: string | undefined, code: string): Promise<Response> {
  return fetch(new URL("/execute", gatewayUrl), {
    method: "POST",
    headers: { "Content-Type": "application/json", ...(token ? { "X-Access-Token": token } : {}) },
    body: JSON.stringify({ code }),
    signal: AbortSignal.timeout(120_000),
  });
}

beforeAll(async () => {
  await purge(config);
  const { microvm } = await selectRuntime(config, log);
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  running = await startNodeAgent(config, log, microvm);
  client = agentClient(running);
  await running.agent.ensureTemplate(TEMPLATE);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const id of created) await client.kill({ sandboxId: id }).catch(() => undefined);
  await running?.stop({ killAll: true });
  await purge(config);
  redis.disconnect();
}, 180_000);

describe("the code gateway in microVM guests (TCG)", () => {
  it("a code-interpreter sandbox is ready with envd and the gateway on 49999, which runs 1+1 in a real kernel, behind envd's token", async () => {
    const placement = await client.create({
      sandboxId: "mccode",
      teamId: "team-mc",
      templateId: TEMPLATE,
      envdAccessToken: "token-mccode",
    });
    created.add("mccode");
    const gateway = new URL(placement.envdUrl);
    gateway.port = "49999";
    // Ready means both answered: no retry needed here.
    expect((await fetch(new URL("/health", gateway))).status).toBe(200);
    // The template snapshot was taken with the default kernels up: a restored gateway has them at once.
    const ready = await fetch(new URL("/warren/ready", gateway));
    expect(await ready.json()).toEqual({ kernels: "started" });
    const denied = await execute(gateway, undefined, "1+1");
    expect(denied.status, await denied.text()).toBe(401);

    const run = await execute(gateway, "token-mccode", "1+1");
    const body = await run.text();
    expect(run.status, body).toBe(200);
    const lines = body
      .split("\n")
      .filter(Boolean)
      .map((line) => JSON.parse(line) as OutputLine);
    expect(lines.find((line) => line.type === "result")?.text).toBe("2");
    expect(lines.some((line) => line.type === "error")).toBe(false);

    // The gateway runs beside envd in the guest, in a session of its own; the kernel is the guest's python.
    const sandbox = sdkSandbox("mccode", placement.envdUrl, "token-mccode");
    const ps = await sandbox.commands.run(
      "ps -eo sid,args | grep -E 'code-gateway/dist/main.js|ipykernel' | grep -v grep",
      {
        timeoutMs: 60_000,
      },
    );
    expect(ps.stdout).toContain("/opt/warren/code-gateway/dist/main.js");
  }, 300_000);
});
