import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { routeKey } from "@warren/proto/redis";
import type { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OutsideWorld, WORLD } from "../../e2e/src/outside-world.js";
import type { NodeAgentConfig } from "../src/node-agent/config.js";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import { type RunningNodeAgent, startNodeAgent } from "../src/node-agent/node-agent.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { agentClient, BUILD_TIMEOUT_MS, sdkSandbox, slotOf, testConfig, until } from "./node-agent-harness.js";

// Egress policies of microVM sandboxes (TCG). The "internet" is a network namespace this file creates
// (e2e/src/outside-world.ts: servers on 198.18.x, a DNS server for *.test.warren): traffic goes only there, to
// loopback, and to the node's own sandbox links. What must never be reached (link-local metadata) is checked by
// reading the rules, not by sending to it.
const world = new OutsideWorld();
const SETUP = {
  instance: "me",
  cidr: "10.239.0.0/23",
  extraEnv: {
    WARREN_DRIVER: "microvm-tcg",
    WARREN_CHECKPOINT_AFTER_MS: "1500",
    WARREN_DNS_UPSTREAM: world.dnsUpstream,
  },
};
const config = testConfig(SETUP);
const redis = new Redis(config.redisUrl);
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
const ALL_TRAFFIC = "0.0.0.0/0";
const A = `http://${WORLD.serverA}/`;
const B = `http://${WORLD.serverB}/`;
let running: RunningNodeAgent<MicrovmDriver>;
let client: ReturnType<typeof agentClient>;
/** A service of the node on every address (stands for the node agent and whatever else the node runs). */
let nodeService: Server;
const created = new Set<string>();

async function startAgent(): Promise<RunningNodeAgent<MicrovmDriver>> {
  const { microvm } = await selectRuntime(config, log);
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  return startNodeAgent(config, log, microvm);
}

/** Whatever a failed run left of this agent tag (VMs, namespaces, files, routes, snapshots) is removed. */
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
    for (const snapshot of await microvm.listSnapshots()) await microvm.deleteSnapshot(snapshot.snapshotId);
  } finally {
    await microvm.close();
  }
}

interface Policy {
  readonly allowOut: string[];
  readonly denyOut: string[];
}

async function createSandbox(sandboxId: string, egress?: Policy, extra: Record<string, unknown> = {}) {
  const placement = await client.create({
    sandboxId,
    teamId: "team-me",
    templateId: "base",
    envdAccessToken: `token-${sandboxId}`,
    ...(egress ? { egress } : {}),
    ...extra,
  });
  created.add(sandboxId);
  return { placement, sandbox: sdkSandbox(sandboxId, placement.envdUrl, `token-${sandboxId}`) };
}

/** `curl` from inside the guest: the body (or curl's error) and exit code, never a throw. */
async function fetchFrom(sandbox: Sandbox, url: string, extra = ""): Promise<{ rc: number; out: string }> {
  const result = await sandbox.commands.run(
    `out=$(curl -sS -m 5 ${extra} '${url}' 2>&1); echo "$?"; printf '%s' "$out"`,
    { timeoutMs: 60_000 },
  );
  const [rc, ...rest] = result.stdout.split("\n");
  return { rc: Number(rc), out: rest.join("\n") };
}

async function reaches(sandbox: Sandbox, url: string): Promise<boolean> {
  const { rc, out } = await fetchFrom(sandbox, url);
  return rc === 0 && out.startsWith("server-");
}

function netnsRules(sandboxAddr: string): string[] {
  const netns = `warren-${config.instance}-vm${slotOf(config.netCidr, sandboxAddr)}`;
  return execFileSync("ip", ["netns", "exec", netns, "iptables-save"], { encoding: "utf8" }).split("\n");
}

/** Index of the first rule holding every token (iptables prints matches in its own order). */
function ruleAt(lines: readonly string[], ...tokens: string[]): number {
  return lines.findIndex((line) => tokens.every((token) => line.includes(token)));
}

function hostChain(chain: string): string[] {
  return execFileSync("iptables", ["-w", "-S", chain], { encoding: "utf8" }).split("\n");
}

beforeAll(async () => {
  await world.start();
  await purge(config);
  nodeService = createServer((_req, res) => res.end("node service"));
  await new Promise<void>((resolve) => nodeService.listen(0, "0.0.0.0", () => resolve()));
  running = await startAgent();
  client = agentClient(running);
  await running.agent.ensureTemplate("base");
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const id of created) await client.kill({ sandboxId: id }).catch(() => undefined);
  await running?.stop({ killAll: true });
  await purge(config);
  nodeService?.close();
  await world.stop();
  redis.disconnect();
}, 180_000);

describe("egress policies of microVM sandboxes (TCG)", () => {
  it("by default nothing leaves: neither an outside server nor DNS answers the guest", async () => {
    const { placement, sandbox } = await createSandbox("meclosed");
    expect(await reaches(sandbox, A)).toBe(false);
    const dns = await fetchFrom(sandbox, "http://a.test.warren/");
    expect(dns.rc).not.toBe(0);
    // The guest's only way out is its tap; the namespace rejects what the policy does not allow.
    const routes = await sandbox.commands.run("cat /proc/net/route");
    // Destination 0.0.0.0 via 192.168.127.1 (little-endian hex).
    expect(routes.stdout).toMatch(/^eth0\s+00000000\s+017FA8C0\s/m);
    const rules = netnsRules(placement.sandboxAddr);
    const last = rules.filter((line) => line.startsWith("-A FORWARD")).at(-1) ?? "";
    expect(last.split(" ").sort()).toEqual(
      "-A FORWARD -s 192.168.127.2/32 -i tap0 -o eth0 -j WARREN-REJECT".split(" ").sort(),
    );
  }, 180_000);

  it("allowOut of an IP with ALL_TRAFFIC denied reaches that server and nothing else", async () => {
    const { sandbox } = await createSandbox("meallow", { allowOut: [WORLD.serverA], denyOut: [ALL_TRAFFIC] });
    const a = await fetchFrom(sandbox, A);
    // The world sees the node's address (egress is masqueraded), not the guest's fixed one.
    expect(a.out).toBe(`server-a ${WORLD.serverA} from 198.18.0.1`);
    expect(await reaches(sandbox, `http://${WORLD.serverA}:8080/`)).toBe(true);
    expect(await reaches(sandbox, B)).toBe(false);
  }, 180_000);

  it("allowOut wins over denyOut, denyOut narrows an open default, and setEgress flips it without a restart", async () => {
    const { sandbox } = await createSandbox("meflip");
    const before = await sandbox.commands.run("cat /proc/sys/kernel/random/boot_id; echo $$", { timeoutMs: 60_000 });
    const sleeper = await sandbox.commands.run("sleep 100000", { background: true });
    const { instanceId } = running.agent.get("meflip")!;
    const qemuPid = () => readFileSync(`${running.driver.instanceDir(instanceId)}/qemu.pid`, "utf8").trim();
    const qemuBefore = qemuPid();
    expect(await reaches(sandbox, A)).toBe(false);

    await client.updateEgress({
      sandboxId: "meflip",
      egress: { allowOut: [WORLD.serverA], denyOut: ["198.18.1.0/24"] },
    });
    expect(await reaches(sandbox, A)).toBe(true);
    expect(await reaches(sandbox, B)).toBe(true);

    await client.updateEgress({ sandboxId: "meflip", egress: { allowOut: [], denyOut: ["198.18.2.0/24"] } });
    expect(await reaches(sandbox, A)).toBe(true);
    expect(await reaches(sandbox, B)).toBe(false);

    await client.updateEgress({ sandboxId: "meflip", egress: { allowOut: [], denyOut: [ALL_TRAFFIC] } });
    expect(await reaches(sandbox, A)).toBe(false);
    expect(running.driver.egressOf(instanceId)).toEqual({ allowOut: [], denyOut: [ALL_TRAFFIC] });

    // The same guest all along: same boot, same processes, same QEMU.
    const after = await sandbox.commands.run(
      `cat /proc/sys/kernel/random/boot_id; kill -0 ${sleeper.pid} && echo alive`,
    );
    expect(after.stdout.split("\n")[0]).toBe(before.stdout.split("\n")[0]);
    expect(after.stdout).toContain("alive");
    expect(qemuPid()).toBe(qemuBefore);
  }, 240_000);

  it("a domain policy is enforced by the node's gateway: the named host only, by name, over HTTP and TLS", async () => {
    const { sandbox } = await createSandbox("medomain", { allowOut: ["a.test.warren"], denyOut: [ALL_TRAFFIC] });
    const a = await fetchFrom(sandbox, "http://a.test.warren/");
    expect(a.rc).toBe(0);
    // The gateway connected for the guest (from the node's address on the world's link).
    expect(a.out).toBe("server-a a.test.warren from 198.18.0.1");
    const tls = await fetchFrom(sandbox, "https://a.test.warren/", "-k");
    expect(tls.out).toBe("server-a:tls a.test.warren from 198.18.0.1");
    // Another name does not resolve for this sandbox; the permitted name's address by IP is still denied.
    expect((await fetchFrom(sandbox, "http://b.test.warren/")).rc).not.toBe(0);
    const raw = await fetchFrom(sandbox, A, "-o /dev/null -w %{http_code}");
    expect(raw.out).toBe("403");
    expect(await reaches(sandbox, `http://${WORLD.serverA}:8080/`)).toBe(false);
  }, 180_000);

  it("the floor holds whatever the policy: no metadata, node service, own network or other sandbox", async () => {
    const other = await createSandbox("mefloorb");
    const wide = {
      allowOut: ["169.254.169.254", config.netCidr, "10.0.0.0/8", ALL_TRAFFIC],
      denyOut: [],
    };
    const { placement, sandbox } = await createSandbox("meflooropen", wide);
    // The policy is open: the world answers.
    expect(await reaches(sandbox, A)).toBe(true);
    const hostSide = placement.sandboxAddr.replace(/\d+$/, (last) => String(Number(last) - 1));
    const nodePort = (nodeService.address() as AddressInfo).port;
    // The node's service answers the node itself on that address, but not the guest.
    expect(await (await fetch(`http://${hostSide}:${nodePort}/`)).text()).toBe("node service");
    for (const target of [`http://${hostSide}:${nodePort}/`, `http://${other.placement.sandboxAddr}:49983/health`]) {
      const result = await fetchFrom(sandbox, target);
      expect(result.rc, target).not.toBe(0);
    }
    // Metadata (not sent to: it is a real address elsewhere): the namespace rejects link-local before any allow,
    // and the host drops forwarding to it from every microVM link.
    const rules = netnsRules(placement.sandboxAddr);
    const policyRule = (...tokens: string[]) =>
      ruleAt(rules, "-A FORWARD", "-i tap0", "-s 192.168.127.2/32", ...tokens);
    // The first rule letting anything out other than replies and the gateway's ports is an allowOut one.
    const firstAllow = rules.findIndex(
      (line) =>
        line.startsWith("-A FORWARD") &&
        line.includes("-i tap0") &&
        line.endsWith("-j ACCEPT") &&
        !line.includes("ESTABLISHED") &&
        !line.includes(`${hostSide}/32`),
    );
    expect(firstAllow).toBeGreaterThan(0);
    expect(policyRule("-d 169.254.169.254/32", "-j ACCEPT")).toBeGreaterThanOrEqual(firstAllow);
    for (const cidr of ["169.254.0.0/16", config.netCidr]) {
      const reject = policyRule(`-d ${cidr}`, "-j WARREN-REJECT");
      expect(reject, cidr).toBeGreaterThan(0);
      expect(reject, cidr).toBeLessThan(firstAllow);
    }
    const forward = hostChain(`WARREN-${config.instance.toUpperCase()}-VMFWD`);
    const veths = `-i wv-${config.instance}-+`;
    const dropMeta = ruleAt(forward, veths, "-d 169.254.0.0/16", "-j DROP");
    const acceptOut = ruleAt(forward, veths, `-s ${config.netCidr}`, "-j ACCEPT");
    expect(dropMeta).toBeGreaterThan(0);
    expect(acceptOut).toBeGreaterThan(dropMeta);
    // Of the node, a guest may open only the gateway's ports (UDP DNS, TCP HTTP/TLS).
    const input = hostChain(`WARREN-${config.instance.toUpperCase()}-VMIN`).filter((l) => l.includes("ACCEPT"));
    expect(input).toHaveLength(3);
    expect(input.filter((l) => l.includes("--dport") || l.includes("--dports"))).toHaveLength(2);
  }, 240_000);

  it("policies survive a checkpoint to disk, an agent restart, and a fork gets the policy it is created with", async () => {
    const { sandbox } = await createSandbox("mekeep", { allowOut: ["a.test.warren"], denyOut: [ALL_TRAFFIC] });
    expect((await fetchFrom(sandbox, "http://a.test.warren/")).rc).toBe(0);
    const { instanceId } = running.agent.get("mekeep")!;

    await client.pause({ sandboxId: "mekeep", memory: true });
    await until("checkpointed to disk", 90_000, () =>
      running.driver.list().find((i) => i.instanceId === instanceId)?.checkpointed ? true : undefined,
    );
    await client.resume({ sandboxId: "mekeep", memory: true });
    expect((await fetchFrom(sandbox, "http://a.test.warren/")).out).toBe("server-a a.test.warren from 198.18.0.1");

    // A new agent: the gateway listens on new ports, and reconcile rewrote the guest's rules to them.
    await running.stop();
    running = await startAgent();
    client = agentClient(running);
    expect(running.driver.egressOf(instanceId)).toEqual({ allowOut: ["a.test.warren"], denyOut: [ALL_TRAFFIC] });
    expect((await fetchFrom(sandbox, "http://a.test.warren/")).out).toBe("server-a a.test.warren from 198.18.0.1");
    expect(await reaches(sandbox, B)).toBe(false);

    await client.snapshot({ sandboxId: "mekeep", snapshotId: "me-keep" });
    const fork = await createSandbox(
      "mefork",
      { allowOut: [WORLD.serverB], denyOut: [ALL_TRAFFIC] },
      {
        snapshotId: "me-keep",
        snapshotEnvdAccessToken: "token-mekeep",
      },
    );
    expect(await reaches(fork.sandbox, B)).toBe(true);
    expect((await fetchFrom(fork.sandbox, "http://a.test.warren/")).rc).not.toBe(0);
    // The source kept its own.
    expect((await fetchFrom(sandbox, "http://a.test.warren/")).rc).toBe(0);
  }, 400_000);
});
