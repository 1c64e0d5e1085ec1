import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { readFile, readlink } from "node:fs/promises";
import { dirname, join } from "node:path";
import { routeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NodeAgentConfig } from "../src/node-agent/config.js";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import { type RunningNodeAgent, startNodeAgent } from "../src/node-agent/node-agent.js";
import { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { processStartTime } from "../src/runtime/microvm/qemu.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { qemuOverheadMiB } from "../src/runtime/microvm/vm-cgroups.js";
import { agentClient, BUILD_TIMEOUT_MS, sdkSandbox, slotOf, testConfig, until } from "./node-agent-harness.js";

// TCG (software emulation) asked for explicitly: CI has no real KVM. The first run builds the guest root image and
// the template snapshot (one cold boot, cached by content hash under /var/lib/warren/microvm); later runs only
// restore. The agent checkpoints a paused sandbox to disk after 1.5 s, so the deep pause tier is what resumes.
/** The cap on each guest's console.log on the node (far above a boot's few kB). */
const LOG_CAP = 256 << 10;
const SETUP = {
  instance: "mv",
  cidr: "10.236.0.0/22",
  extraEnv: {
    WARREN_DRIVER: "microvm-tcg",
    WARREN_CHECKPOINT_AFTER_MS: "1500",
    WARREN_SANDBOX_LOG_MAX_BYTES: String(LOG_CAP),
  },
};
const config = testConfig(SETUP);
const redis = new Redis(config.redisUrl);
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
let running: RunningNodeAgent<MicrovmDriver>;
let client: ReturnType<typeof agentClient>;
const created = new Set<string>();

async function startAgent(): Promise<RunningNodeAgent<MicrovmDriver>> {
  const { probe, microvm } = await selectRuntime(config, log);
  expect(probe.driver).toBe("microvm-tcg");
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  return startNodeAgent(config, log, microvm);
}

/** Whatever a failed run left of this agent tag (VMs, namespaces, files, routes) is removed. */
async function purge(cfg: NodeAgentConfig): Promise<void> {
  const { microvm } = await selectRuntime(cfg, silentLogger);
  if (!microvm) return;
  await microvm.start();
  const { adopted, removed } = await microvm.reconcile();
  for (const instance of adopted) {
    await microvm.kill(instance.instanceId);
    if (instance.labels.sandboxId) await redis.del(routeKey(instance.labels.sandboxId));
  }
  for (const r of removed) if (r.labels.sandboxId) await redis.del(routeKey(r.labels.sandboxId));
}

/** The process still runs (a zombie waiting for the host's init to reap it does not). */
async function processRuns(pid: number, startTime: string | undefined): Promise<boolean> {
  if ((await processStartTime(pid)) !== startTime) return false;
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  if (!stat) return false;
  return !stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
}

const CGROUP_V2 = existsSync("/sys/fs/cgroup/cgroup.controllers");

/** The cgroup path (below the hierarchy's root) of an agent tag's microVM instance. */
function vmCgroup(tag: string, instanceId: string): string {
  return `/warren/${tag}-vm/${instanceId}`;
}

/** The directory holding a microVM cgroup's memory files (v1: the memory hierarchy's). */
function memoryDir(tag: string, instanceId: string): string {
  return join("/sys/fs/cgroup", CGROUP_V2 ? "" : "memory", vmCgroup(tag, instanceId));
}

/** Memory limit of a microVM's cgroup, in bytes. */
function memoryLimitBytes(tag: string, instanceId: string): number {
  return Number(
    readFileSync(join(memoryDir(tag, instanceId), CGROUP_V2 ? "memory.max" : "memory.limit_in_bytes"), "utf8"),
  );
}

/** The process is in the cgroup for memory, CPU and pids (v1: each hierarchy; v2: the unified one). */
function inCgroup(pid: number, path: string): boolean {
  const lines = readFileSync(`/proc/${pid}/cgroup`, "utf8").trim().split("\n");
  const pathOf = (controller: string) =>
    lines
      .map((line) => line.split(":"))
      .find(([, controllers]) => (CGROUP_V2 ? controllers === "" : controllers?.split(",").includes(controller)))?.[2];
  return ["memory", "cpu", "pids"].every((controller) => pathOf(controller) === path);
}

function qemuPidOf(dir: string): number {
  return Number(readFileSync(`${dir}/qemu.pid`, "utf8").trim());
}

/** QEMU's mapping of a template snapshot's RAM file (its smaps entry), if it has one. */
function ramMapping(pid: number): { path: string; perms: string; sharedCleanKiB: number } | undefined {
  const smaps = readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n");
  const at = smaps.findIndex((line) => /^[0-9a-f]+-[0-9a-f]+ \S+ .* \/\S+\/ram$/.test(line));
  if (at < 0) return undefined;
  const [, perms = "", , , , path = ""] = smaps[at]?.split(/\s+/) ?? [];
  let sharedCleanKiB = 0;
  for (const line of smaps.slice(at + 1)) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) break;
    const shared = /^Shared_Clean:\s+(\d+) kB/.exec(line);
    if (shared) sharedCleanKiB = Number(shared[1]);
  }
  return { path, perms, sharedCleanKiB };
}

async function createSandbox(sandboxId: string, extra: Record<string, unknown> = {}) {
  const placement = await client.create({
    sandboxId,
    teamId: "team-vm",
    templateId: "base",
    envdAccessToken: `token-${sandboxId}`,
    ...extra,
  });
  created.add(sandboxId);
  return placement;
}

beforeAll(async () => {
  await purge(config);
  running = await startAgent();
  client = agentClient(running);
  // The template's ready check under this driver is the first create: it builds the root image and snapshot.
  await running.agent.ensureTemplate("base");
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const id of created) await client.kill({ sandboxId: id }).catch(() => undefined);
  await running?.stop({ killAll: true });
  await purge(config);
  redis.disconnect();
}, 120_000);

describe("node agent with the microvm driver (QEMU microvm, TCG)", () => {
  it("node info reports the driver the probe chose", async () => {
    expect((await client.info({})).driver).toBe("microvm-tcg");
    // Templates that require a microVM are this node's to run.
    expect(running.agent.info().servable).toEqual(expect.arrayContaining(["base", "base-vm"]));
  });

  it("create from the template snapshot → commands.run → pause (checkpoint to disk) → resume: same pid running, files kept → kill leaves nothing", async () => {
    const placement = await createSandbox("mvlife", { envVars: { WARREN_GREETING: "hello from a vm" } });
    expect(placement.envdUrl).toBe(`http://${placement.sandboxAddr}:49983`);
    expect(placement.envdVersion).toBe("0.6.4");
    const sandbox = sdkSandbox("mvlife", placement.envdUrl, "token-mvlife");
    const who = await sandbox.commands.run("id -un; echo $WARREN_GREETING; uname -r; cat /proc/1/comm");
    const [user, greeting, kernel, init] = who.stdout.trim().split("\n");
    expect(user).toBe("user");
    expect(greeting).toBe("hello from a vm");
    // Its own kernel (the guest's Debian cloud kernel), not the host's.
    expect(kernel).toMatch(/-cloud-amd64$/);
    expect(init).toBe("tini");
    await sandbox.files.write("/home/user/notes.txt", "kept across pause");
    const sleeper = await sandbox.commands.run("sleep 100000", { background: true });
    expect(sleeper.pid).toBeGreaterThan(0);
    // Restored from a snapshot taken minutes earlier, the guest's clock was set to the host's before create
    // returned (unset, it would be off by those minutes). An emulated guest's clock runs slow while the host is
    // loaded: seconds of drift between the set and this read are the emulation's, not a missed set.
    const guestClock = Number((await sandbox.commands.run("date +%s")).stdout.trim());
    expect(Math.abs(guestClock - Date.now() / 1000)).toBeLessThan(15);

    const summary = running.agent.get("mvlife")!;
    const dir = running.driver.instanceDir(summary.instanceId);
    // A restore is a clone of the snapshot's memory: the guest's kernel reseeded its CRNG with the host's bytes.
    expect(readFileSync(join(dir, "console.log"), "utf8")).toMatch(/WARREN-CLOCK-SET \d+ reseeded/);
    // QEMU (the daemon, not only its launcher) runs in the instance's own cgroup: guest memory + QEMU's allowance.
    const cgroup = vmCgroup(config.instance, summary.instanceId);
    expect(inCgroup(qemuPidOf(dir), cgroup)).toBe(true);
    const limitBytes = (summary.resources.memoryMB + qemuOverheadMiB("tcg")) * 2 ** 20;
    expect(memoryLimitBytes(config.instance, summary.instanceId)).toBe(limitBytes);
    // Stats: the guest's memory as the sandbox's limit; the VM's cost to the host (its cgroup) as its usage.
    const stats = await running.driver.stats(summary.instanceId);
    expect(stats.memoryLimitBytes).toBe(summary.resources.memoryMB * 2 ** 20);
    expect(stats.memoryUsageBytes).toBeGreaterThan(0);
    expect(stats.memoryUsageBytes).toBeLessThanOrEqual(limitBytes);
    await client.pause({ sandboxId: "mvlife", memory: true });
    expect(await redis.hget(routeKey("mvlife"), "state")).toBe("paused");
    // The agent converts the paused VM into a memory snapshot on disk and QEMU ends (memory released).
    await until("checkpointed to disk", 90_000, () =>
      running.driver.list().find((i) => i.instanceId === summary.instanceId)?.checkpointed ? true : undefined,
    );
    expect(existsSync(`${dir}/memory.snap`)).toBe(true);
    expect((await running.driver.stats(summary.instanceId)).memoryUsageBytes).toBe(0);
    // No QEMU, no cgroup until the resume.
    expect(existsSync(memoryDir(config.instance, summary.instanceId))).toBe(false);

    const resumed = await client.resume({ sandboxId: "mvlife", memory: true });
    expect(resumed.exec).not.toBe(placement.exec);
    expect(await redis.hget(routeKey("mvlife"), "state")).toBe("running");
    expect(existsSync(`${dir}/memory.snap`)).toBe(false);
    // Same address and token after a resume (the proxy routes by the new exec; here the SDK talks to envd).
    const after = sdkSandbox("mvlife", placement.envdUrl, "token-mvlife");
    const alive = await after.commands.run(`cat /proc/${sleeper.pid}/cmdline | tr '\\0' ' '`);
    expect(alive.stdout.trim()).toBe("sleep 100000");
    expect(await after.files.read("/home/user/notes.txt")).toBe("kept across pause");
    // The QEMU restored from disk is in a cgroup of its own again.
    expect(inCgroup(qemuPidOf(dir), cgroup)).toBe(true);
    expect(memoryLimitBytes(config.instance, summary.instanceId)).toBe(limitBytes);

    const slot = slotOf(config.netCidr, placement.sandboxAddr);
    const netns = `/run/netns/warren-${config.instance}-vm${slot}`;
    const veth = `/sys/class/net/wv-${config.instance}-${slot}`;
    const qemuPid = qemuPidOf(dir);
    expect(readFileSync(`/proc/${qemuPid}/cmdline`, "utf8")).toContain("qemu-system-x86_64");
    expect(existsSync(netns) && existsSync(veth)).toBe(true);
    const qemuStart = await processStartTime(qemuPid);
    await client.kill({ sandboxId: "mvlife" });
    created.delete("mvlife");
    expect(await processRuns(qemuPid, qemuStart)).toBe(false);
    expect(existsSync(netns)).toBe(false);
    expect(existsSync(veth)).toBe(false);
    expect(existsSync(dir)).toBe(false);
    expect(existsSync(memoryDir(config.instance, summary.instanceId))).toBe(false);
    expect(await redis.exists(routeKey("mvlife"))).toBe(0);
  }, 300_000);

  it("QEMU runs jailed: a uid of its own per sandbox, no capabilities, seccomp, chrooted into its instance directory", async () => {
    const jailOf = (sandboxId: string) => {
      const summary = running.agent.get(sandboxId)!;
      const dir = running.driver.instanceDir(summary.instanceId);
      const pid = qemuPidOf(dir);
      const status = readFileSync(`/proc/${pid}/status`, "utf8");
      const field = (name: string) => new RegExp(`^${name}:\\s+(.*)$`, "m").exec(status)?.[1]?.trim().split(/\s+/);
      return {
        dir,
        pid,
        uids: field("Uid"),
        gids: field("Gid"),
        capEff: field("CapEff")?.[0],
        seccomp: field("Seccomp")?.[0],
      };
    };
    const a = await createSandbox("mvjaila");
    const b = await createSandbox("mvjailb");
    const jailA = jailOf("mvjaila");
    const jailB = jailOf("mvjailb");
    const slotA = running.driver.network.slot(slotOf(config.netCidr, a.sandboxAddr));
    const slotB = running.driver.network.slot(slotOf(config.netCidr, b.sandboxAddr));
    // Real, effective, saved and filesystem ids all dropped (no way back to root), each sandbox its own.
    expect(jailA.uids).toEqual(Array(4).fill(String(slotA.qemuUid)));
    expect(jailA.gids).toEqual(Array(4).fill(String(slotA.qemuUid)));
    expect(jailB.uids).toEqual(Array(4).fill(String(slotB.qemuUid)));
    expect(slotA.qemuUid).not.toBe(slotB.qemuUid);
    expect(slotA.qemuUid).toBeGreaterThanOrEqual(2 ** 30);
    expect(jailA.capEff).toBe("0000000000000000");
    expect(jailA.seccomp).toBe("2");
    // Its root is its own instance directory: nothing else of the host, nor the other sandbox's files.
    expect(await readlink(`/proc/${jailA.pid}/root`)).toBe(jailA.dir);
    expect(await readlink(`/proc/${jailB.pid}/root`)).toBe(jailB.dir);
    // Guest RAM: a private (copy-on-write) mapping of the template snapshot's RAM file, the same file for both,
    // whose untouched pages are shared between them (one page cache); the snapshot's stream is device state only.
    const ramA = ramMapping(jailA.pid);
    const ramB = ramMapping(jailB.pid);
    expect(ramA?.perms).toBe("rw-p");
    expect(ramB?.path).toBe(ramA?.path);
    expect(ramA?.sharedCleanKiB).toBeGreaterThan(0);
    expect(ramB?.sharedCleanKiB).toBeGreaterThan(0);
    const templateDir = dirname(ramA?.path ?? "");
    expect(statSync(join(templateDir, "memory.snap")).size).toBeLessThan(2 ** 20);
    expect(statSync(join(templateDir, "disk.qcow2")).uid).toBe(0);
    // The one file it may write is its disk layer.
    expect(statSync(join(jailA.dir, "disk.qcow2")).uid).toBe(slotA.qemuUid);
    expect(statSync(jailA.dir).uid).toBe(0);

    // A migration written from inside the jail (a checkpoint) ends up root's, readable by root only.
    await client.pause({ sandboxId: "mvjaila", memory: true });
    const instanceA = running.agent.get("mvjaila")!.instanceId;
    await until("checkpointed to disk", 90_000, () =>
      running.driver.list().find((i) => i.instanceId === instanceA)?.checkpointed ? true : undefined,
    );
    const memory = statSync(join(jailA.dir, "memory.snap"));
    expect(memory.uid).toBe(0);
    expect(memory.mode & 0o777).toBe(0o600);
    expect(existsSync(join(jailA.dir, "migrate.out"))).toBe(false);
    await client.resume({ sandboxId: "mvjaila", memory: true });
    const restored = jailOf("mvjaila");
    expect(restored.pid).not.toBe(jailA.pid);
    expect(restored.uids).toEqual(Array(4).fill(String(slotA.qemuUid)));
    expect(await readlink(`/proc/${restored.pid}/root`)).toBe(jailA.dir);
    // Restored from its own checkpoint (all of its memory in the stream): ordinary RAM again.
    expect(ramMapping(restored.pid)).toBeUndefined();
    const sandbox = sdkSandbox("mvjaila", a.envdUrl, "token-mvjaila");
    expect((await sandbox.commands.run("echo restored")).stdout.trim()).toBe("restored");
    for (const id of ["mvjaila", "mvjailb"]) {
      await client.kill({ sandboxId: id });
      created.delete(id);
    }
  }, 120_000);

  it("the instant tier: QMP stop freezes the whole guest (envd stops answering) and cont brings it back", async () => {
    const placement = await createSandbox("mvfreeze");
    const { instanceId } = running.agent.get("mvfreeze")!;
    const sandbox = sdkSandbox("mvfreeze", placement.envdUrl, "token-mvfreeze");
    const ticker = await sandbox.commands.run("while :; do date +%s%N > /tmp/tick; sleep 0.2; done", {
      background: true,
    });
    await running.driver.pause(instanceId);
    expect(running.driver.list().find((i) => i.instanceId === instanceId)?.paused).toBe(true);
    const frozen = await fetch(`${placement.envdUrl}/health`, { signal: AbortSignal.timeout(1500) }).then(
      () => "answered",
      () => "silent",
    );
    expect(frozen).toBe("silent");
    await running.driver.resume(instanceId);
    const alive = await sandbox.commands.run(`kill -0 ${ticker.pid} && echo running`);
    expect(alive.stdout.trim()).toBe("running");
  }, 120_000);

  it("the guest's console log on the node (written by the guest: a sandbox's root floods it) stays under its cap", async () => {
    const placement = await createSandbox("mvlog");
    const sandbox = sdkSandbox("mvlog", placement.envdUrl, "token-mvlog");
    const consoleLog = join(running.driver.instanceDir(running.agent.get("mvlog")!.instanceId), "console.log");
    const flood = await sandbox.commands.run(
      "head -c 600000 /dev/zero | tr '\\0' y | fold -w 100 > /dev/console && echo flooded",
      { user: "root", timeoutMs: 240_000 },
    );
    expect(flood.stdout).toBe("flooded\n");
    const size = await until("console.log cut under the cap", 30_000, () => {
      const bytes = statSync(consoleLog).size;
      return bytes <= LOG_CAP ? bytes : undefined;
    });
    expect(size).toBeGreaterThan(LOG_CAP / 4); // cut to its end, not emptied
    // QEMU writes on at the new end (its log file is opened O_APPEND).
    await sandbox.commands.run("echo after-the-cut > /dev/console", { user: "root" });
    const lines = await until("the line written after the cut, in the logs API", 30_000, async () => {
      const all = await running.agent.logs("mvlog", 10_000);
      return all.some((line) => line.message === "after-the-cut") ? all : undefined;
    });
    expect(lines[0]).toMatchObject({ level: "warn", fields: { component: "warren" } });
    expect(readFileSync(consoleLog, "utf8")).not.toContain("\0");
    await client.kill({ sandboxId: "mvlog" });
  }, 300_000);

  it("a guest reaches neither the node's services, nor its namespace's gateway, nor another sandbox", async () => {
    const a = await createSandbox("mvneta");
    const b = await createSandbox("mvnetb");
    const sa = sdkSandbox("mvneta", a.envdUrl, "token-mvneta");
    const hostSide = a.sandboxAddr.replace(/\d+$/, (last) => String(Number(last) - 1));
    const targets = [
      `${hostSide}:${running.port}`, // the node agent, on the host end of this sandbox's link
      "192.168.127.1:22", // the sandbox namespace itself
      `${b.sandboxAddr}:49983`, // another sandbox's envd
      "169.254.169.254:80", // link-local metadata
    ];
    const probe = targets
      .map((t) => `curl -s -o /dev/null -m 3 http://${t}/ && echo "${t} reached" || echo "${t} blocked"`)
      .join("; ");
    const result = await sa.commands.run(`${probe}; ip route 2>/dev/null || cat /proc/net/route`);
    for (const t of targets) expect(result.stdout).toContain(`${t} blocked`);
    // The node reaches the guest, and any port a guest process listens on, at the sandbox's address.
    await sa.commands.run("cd /tmp && exec python3 -m http.server 8080 --bind 0.0.0.0", { background: true });
    const body = await until("guest port 8080 reachable from the node", 30_000, () =>
      fetch(`http://${a.sandboxAddr}:8080/`).then(
        (res) => (res.ok ? res.status : undefined),
        () => undefined,
      ),
    );
    expect(body).toBe(200);
    // One listening on the guest's loopback only is reachable too (envd forwards it, as E2B's does).
    await sa.commands.run("cd /tmp && exec python3 -m http.server 8081 --bind 127.0.0.1", { background: true });
    const local = await until("loopback-only guest port 8081 reachable from the node", 30_000, () =>
      fetch(`http://${a.sandboxAddr}:8081/`).then(
        (res) => (res.ok ? res.status : undefined),
        () => undefined,
      ),
    );
    expect(local).toBe(200);
  }, 120_000);

  it("a restarted agent re-adopts a running microVM sandbox (reconcile)", async () => {
    const placement = await createSandbox("mvadopt");
    const sandbox = sdkSandbox("mvadopt", placement.envdUrl, "token-mvadopt");
    await sandbox.files.write("/home/user/before-restart.txt", "still here");
    await running.stop();
    running = await startAgent();
    client = agentClient(running);
    expect(running.agent.get("mvadopt")?.exec).toBe(placement.exec);
    const again = sdkSandbox("mvadopt", placement.envdUrl, "token-mvadopt");
    expect(await again.files.read("/home/user/before-restart.txt")).toBe("still here");
  }, 120_000);

  it("pause without memory ends QEMU keeping the disk (flushed first); resume cold-boots over it", async () => {
    const placement = await createSandbox("mvcold");
    const sandbox = sdkSandbox("mvcold", placement.envdUrl, "token-mvcold");
    const bootBefore = (await sandbox.commands.run("cat /proc/sys/kernel/random/boot_id")).stdout.trim();
    // Written right before the pause: still only in the guest's page cache unless the driver flushes it.
    await sandbox.commands.run("echo written-late > /home/user/late.txt");
    const { instanceId } = running.agent.get("mvcold")!;
    await client.pause({ sandboxId: "mvcold", memory: false });
    const stopped = running.driver.list().find((i) => i.instanceId === instanceId);
    expect(stopped?.stopped).toBe(true);
    expect((await running.driver.stats(instanceId)).memoryUsageBytes).toBe(0);
    await client.resume({ sandboxId: "mvcold", memory: false, envdAccessToken: "token-mvcold" });
    const after = sdkSandbox("mvcold", placement.envdUrl, "token-mvcold");
    expect(await after.files.read("/home/user/late.txt")).toBe("written-late\n");
    const bootAfter = (await after.commands.run("cat /proc/sys/kernel/random/boot_id")).stdout.trim();
    expect(bootAfter).not.toBe(bootBefore);
  }, 600_000);

  it("a create that fails halfway (restore past its deadline) leaves no QEMU, netns, veth or file behind", async () => {
    const stateDir = "/var/lib/warren/test-mvf";
    const failing = new MicrovmDriver({
      stateDir,
      instance: "mvf",
      netCidr: "10.238.0.0/24",
      accel: "tcg",
      imageDir: config.microvmDir,
      linuxDir: config.microvmKernel,
      nodeBinary: config.nodeBinary,
      envdRoot: config.envdRoot,
      uidBase: config.uidBase,
      readyTimeoutMs: 1,
      log: silentLogger,
    });
    await failing.start();
    // What an earlier, failed run of this test left is adopted here and removed first.
    await failing.reconcile();
    for (const leftover of failing.list()) await failing.kill(leftover.instanceId);
    const template = running.templates.ready("base")!;
    await expect(failing.create({ template, resources: template.recipe.defaults })).rejects.toThrow(/within 1 ms/);
    expect(failing.list()).toEqual([]);
    expect(readdirSync(`${stateDir}/instances`)).toEqual([]);
    expect(readdirSync("/run/netns").filter((n) => n.startsWith("warren-mvf-"))).toEqual([]);
    expect(readdirSync("/sys/class/net").filter((n) => n.startsWith("wv-mvf-"))).toEqual([]);
    const cgroups = join("/sys/fs/cgroup", CGROUP_V2 ? "" : "memory", "warren/mvf-vm");
    expect(readdirSync(cgroups, { withFileTypes: true }).filter((e) => e.isDirectory())).toEqual([]);
    const qemus = readdirSync("/proc")
      .filter((p) => /^\d+$/.test(p))
      .filter((p) => {
        try {
          return readFileSync(`/proc/${p}/cmdline`, "utf8").includes(stateDir);
        } catch {
          return false;
        }
      });
    const live = [];
    for (const pid of qemus) if (await processRuns(Number(pid), await processStartTime(Number(pid)))) live.push(pid);
    expect(live).toEqual([]);
  });
});
