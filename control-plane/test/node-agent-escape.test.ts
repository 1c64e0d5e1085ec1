import { execFileSync, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server } from "node:net";
import { hostname } from "node:os";
import type { Sandbox } from "e2b";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import { healthy } from "../src/runtime/sandbox-process.js";
import {
  agentClient,
  BUILD_TIMEOUT_MS,
  NO_TRACES,
  purgeAgent,
  sdkSandbox,
  slotOf,
  startTestAgent,
  testConfig,
  tracesAfterReclaim,
} from "./node-agent-harness.js";

/**
 * The escape suite: from inside a sandbox (as `user`, and as sandbox root), try to get at the host or at another
 * sandbox. Every attempt must fail and the node must stay healthy. Network attempts go only to addresses this
 * agent created (the host side of the sandbox's own veth, another sandbox's address); blocking of everything
 * else (host addresses, metadata, the internet) is proven by inspecting routes and firewall rules.
 */
const SETUP = { instance: "tb", cidr: "10.210.4.0/22", netPoolSize: 2 };
const config = testConfig(SETUP);
const redis = new Redis(config.redisUrl);
let running: RunningNodeAgent;
let client: ReturnType<typeof agentClient>;
const created = new Set<string>();
const marker = `/var/lib/warren/escape-marker-${randomBytes(4).toString("hex")}`;
let hostListener: Server;
let hostListenerPort = 0;
let hostListenerHits = 0;

interface Run {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** Runs a shell command in the sandbox; a non-zero exit is a result, not an exception. */
async function run(sandbox: Sandbox, cmd: string, user: "user" | "root" = "user", timeoutMs = 60_000): Promise<Run> {
  try {
    const result = await sandbox.commands.run(cmd, { user, timeoutMs });
    return { exitCode: result.exitCode, stdout: result.stdout, stderr: result.stderr };
  } catch (error) {
    const failed = error as Partial<Run>;
    if (typeof failed.exitCode !== "number") throw error;
    return { exitCode: failed.exitCode, stdout: failed.stdout ?? "", stderr: failed.stderr ?? "" };
  }
}

async function start(sandboxId: string, resources?: { memoryMb?: number; diskSizeMb?: number }) {
  const placement = await client.create({
    sandboxId,
    teamId: "team-escape",
    templateId: "base",
    envdAccessToken: `token-${sandboxId}`,
    ...(resources ? { resources } : {}),
  });
  created.add(sandboxId);
  const slot = running.driver.network.slot(slotOf(config.netCidr, placement.sandboxAddr));
  return { placement, slot, sandbox: sdkSandbox(sandboxId, placement.envdUrl, `token-${sandboxId}`) };
}

function nodeIsHealthy(): boolean {
  return spawnSync("true").status === 0 && hostname() === originalHostname;
}

const originalHostname = hostname();
let a: Awaited<ReturnType<typeof start>>;
let b: Awaited<ReturnType<typeof start>>;

beforeAll(async () => {
  writeFileSync(marker, "host secret");
  // A host service listening on every address: the worst case of a loopback service bound too widely.
  hostListener = createServer((socket) => {
    hostListenerHits++;
    socket.end("host service\n");
  });
  await new Promise<void>((resolve) => hostListener.listen(0, "0.0.0.0", resolve));
  hostListenerPort = (hostListener.address() as { port: number }).port;
  running = await startTestAgent(SETUP);
  client = agentClient(running);
  a = await start("escapea");
  b = await start("escapeb");
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  rmSync(marker, { force: true });
  hostListener?.close();
  for (const id of created) await client.kill({ sandboxId: id }).catch(() => undefined);
  await running?.stop({ killAll: true });
  await purgeAgent(config);
  redis.disconnect();
}, 120_000);

describe("escape suite: nothing inside a sandbox reaches the host or another sandbox", { timeout: 120_000 }, () => {
  it("the workload cgroup's descriptors PID 1 holds give sandbox root nothing: no reopening, no cgroup tree", async () => {
    // The launcher opened them as host root and crun handed them to PID 1; a command never inherits them.
    const own = await run(a.sandbox, "ls /proc/self/fd", "root");
    expect(own.stdout.split(/\s+/)).not.toContain("4");
    // Reopening through /proc checks the caller's credentials: sandbox root is not the files' owner, so it cannot
    // write pids there (it may read the workload's OOM count, which the file's mode allows anyone).
    const reopen = await run(
      a.sandbox,
      "echo $$ > /proc/1/fd/3; echo rc=$?; cat /proc/1/fd/4 >/dev/null; echo rc=$?",
      "root",
    );
    expect(reopen.stdout).toBe("rc=1\nrc=0\n");
    expect(reopen.stderr).toMatch(/Permission denied/);
    // The node's cgroup tree is not mounted in the sandbox.
    const tree = await run(a.sandbox, "ls /sys/fs/cgroup", "root");
    expect(tree.exitCode).not.toBe(0);
    expect(tree.stderr).toMatch(/No such file/);
  });

  it("host files outside the rootfs cannot be read, even by sandbox root", async () => {
    const attempt = await run(a.sandbox, `cat ${marker}; ls /proc/1/root${marker}; cat /etc/hostname`, "root");
    expect(attempt.stdout).not.toContain("host secret");
    expect(attempt.stderr).toMatch(/No such file/);
    expect(attempt.stdout.trim()).toBe("sandbox");
    const search = await run(a.sandbox, "find / -xdev -name 'escape-marker-*' 2>/dev/null | wc -l", "root");
    expect(search.stdout.trim()).toBe("0");
  });

  it("the read-only host binds (node, envd) cannot be written, even by sandbox root", async () => {
    const attempt = await run(
      a.sandbox,
      "touch /opt/warren/envd/pwned; cp /bin/true /usr/local/bin/node; echo x >> /opt/warren/node_modules/pwned",
      "root",
    );
    expect(attempt.exitCode).not.toBe(0);
    expect(attempt.stderr).toMatch(/Read-only file system/);
  });

  it("host pids are invisible: the sandbox has its own pid namespace", async () => {
    const attempt = await run(
      a.sandbox,
      "ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
      "root",
    );
    const [count] = attempt.stdout.trim().split("\n");
    expect(Number(count)).toBeLessThan(30);
    expect(attempt.stdout).not.toMatch(/vitest|redis-server|node-agent/);
    expect(attempt.stdout).toMatch(/envd/);
  });

  it("the host's Redis, PostgreSQL, agent and a 0.0.0.0 listener are unreachable via the host side of its veth", async () => {
    // The listener really answers on that address (from the host itself, which is local traffic).
    const fromHost = await new Promise<string>((resolve, reject) => {
      const socket = connect(hostListenerPort, a.slot.hostAddr);
      let text = "";
      socket.setEncoding("utf8").on("data", (chunk: string) => {
        text += chunk;
      });
      socket.once("end", () => resolve(text));
      socket.once("error", reject);
    });
    expect(fromHost.trim()).toBe("host service");
    const hits = hostListenerHits;
    for (const port of [6379, 5432, running.port, hostListenerPort]) {
      const attempt = await run(a.sandbox, `timeout 5 bash -c 'exec 3<>/dev/tcp/${a.slot.hostAddr}/${port}'`, "root");
      expect(attempt.exitCode, `port ${port}`).not.toBe(0);
    }
    expect(hostListenerHits).toBe(hits);
  });

  it("another sandbox is unreachable, while the node reaches both", async () => {
    expect(await healthy(b.placement.sandboxAddr, 2000)).toBe(true);
    const attempt = await run(
      a.sandbox,
      `timeout 5 bash -c 'exec 3<>/dev/tcp/${b.placement.sandboxAddr}/49983'`,
      "root",
    );
    expect(attempt.exitCode).not.toBe(0);
    const curl = await run(a.sandbox, `curl -s -m 5 http://${b.placement.sandboxAddr}:49983/health`, "root");
    expect(curl.exitCode).not.toBe(0);
  });

  it("sandbox root cannot send with another sandbox's address (binding one is allowed, for restored forks)", async () => {
    const spoof = [
      "import socket",
      "s = socket.socket()",
      `s.bind(("${b.placement.sandboxAddr}", 0))`,
      "s.settimeout(5)",
      "try:",
      `    s.connect(("${a.slot.hostAddr}", 53)); print("sent")`,
      "except OSError as e: print(e.errno)",
      "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
      `u.bind(("${b.placement.sandboxAddr}", 0))`,
      "try:",
      `    u.sendto(b"x", ("${a.slot.hostAddr}", 53)); print("sent")`,
      "except OSError as e: print(e.errno)",
    ].join("\n");
    const attempt = await run(a.sandbox, `python3 -c '${spoof}'`, "root");
    // ENETUNREACH both times: the kernel's route lookup refuses a source address that is not local.
    expect(attempt.stdout.trim().split("\n")).toEqual(["101", "101"]);
  });

  it("routes and firewall rules leave no path to host addresses, other networks or link-local metadata", async () => {
    // Inside: the sandbox's own /30 and a default route via the node (egress is the policy's to allow; this
    // sandbox has the agent's default, closed).
    const routes = await run(a.sandbox, "cat /proc/net/route", "root");
    const entries = routes.stdout
      .trim()
      .split("\n")
      .slice(1)
      .map((line) => line.trim().split(/\s+/));
    expect(entries).toHaveLength(2);
    expect(entries.every((e) => e[0] === "eth0")).toBe(true);
    expect((await run(a.sandbox, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6")).stdout.trim()).toBe("1");
    // The sandbox's own firewall (owned by the host, out of sandbox root's reach): the floor (metadata,
    // loopback, multicast, the node's sandbox network) and private ranges rejected, then — closed policy —
    // everything else; only loopback and replies pass.
    const inside = execFileSync("ip", ["netns", "exec", a.slot.netns, "iptables", "-S"], { encoding: "utf8" });
    expect(inside).toContain("-P OUTPUT DROP");
    expect(inside).toContain("-P FORWARD DROP");
    expect(inside).toContain("-A OUTPUT -o lo -j ACCEPT");
    expect(inside).toMatch(/-A OUTPUT -m conntrack --ctstate (RELATED,ESTABLISHED|ESTABLISHED,RELATED) -j ACCEPT/);
    for (const cidr of ["169.254.0.0/16", "127.0.0.0/8", "10.0.0.0/8", "192.168.0.0/16", "172.16.0.0/12"]) {
      expect(inside).toContain(`-A OUTPUT -d ${cidr} -j WARREN-REJECT`);
    }
    expect(inside).toContain(`-A OUTPUT -d ${config.netCidr} -j WARREN-REJECT`);
    expect(inside).toContain("-A OUTPUT -j WARREN-REJECT\n");
    expect(inside).not.toContain("-A OUTPUT -j ACCEPT");
    // The host drops anything new from the veth to itself, never forwards to another sandbox or link-local,
    // and forwards only replies towards the sandbox.
    const host = execFileSync("iptables", ["-w", "-S"], { encoding: "utf8" });
    const tag = `"warren:${config.instance}:${a.slot.index}"`;
    const { inputChain, forwardChain } = running.driver.network;
    expect(host).toContain(`-A ${inputChain} -i ${a.slot.hostVeth} -m comment --comment ${tag} -j DROP`);
    expect(host).toContain(`-A ${forwardChain} -i ${a.slot.hostVeth} -o wr-+ -m comment --comment ${tag} -j DROP`);
    // Nor to a microVM sandbox of an agent of the other driver on the same host.
    expect(host).toContain(`-A ${forwardChain} -i ${a.slot.hostVeth} -o wv-+ -m comment --comment ${tag} -j DROP`);
    expect(host).toContain(
      `-A ${forwardChain} -d 169.254.0.0/16 -i ${a.slot.hostVeth} -m comment --comment ${tag} -j DROP`,
    );
    expect(host).toContain(`-A ${forwardChain} -o ${a.slot.hostVeth} -m comment --comment ${tag} -j DROP`);
    expect(host).toContain(`-A INPUT -j ${running.driver.network.inputChain}`);
    // Sandbox root cannot rewrite kernel network settings.
    const tamper = await run(a.sandbox, "echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6", "root");
    expect(tamper.exitCode).not.toBe(0);
  });

  it("mount, namespaces, module loading, kexec, reboot, bpf and clock changes are refused to sandbox root", async () => {
    const mount = await run(a.sandbox, "mount -t tmpfs evil /mnt", "root");
    expect(mount.exitCode).not.toBe(0);
    const userns = await run(a.sandbox, "unshare -U -r true", "root");
    expect(userns.exitCode).not.toBe(0);
    const sudoMount = await run(a.sandbox, "sudo -n mount -t proc proc /mnt");
    expect(sudoMount.exitCode).not.toBe(0);
    // Raw syscalls (x86-64 numbers), errno printed for each: all must fail with EPERM (1).
    const script = [
      "import ctypes",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "calls = {'finit_module': (313, -1, b'', 0), 'init_module': (175, 0, 0, b''), 'delete_module': (176, b'ext4', 0),",
      "  'kexec_load': (246, 0, 0, 0, 0), 'reboot': (169, 0xfee1dead, 672274793, 0x4321fedc, 0),",
      "  'bpf': (321, 0, 0, 0), 'swapoff': (168, b'/'), 'settimeofday': (164, 0, 0), 'keyctl': (250, 0, 0),",
      "  'unshare_net': (272, 0x40000000), 'setns': (308, 0, 0), 'sethostname': (170, b'evil', 4)}",
      "for name, args in calls.items():",
      "    r = libc.syscall(*args)",
      "    print(name, r, ctypes.get_errno())",
    ].join("\n");
    const raw = await run(a.sandbox, `python3 -c "${script.replace(/"/g, '\\"')}"`, "root");
    const results = Object.fromEntries(
      raw.stdout
        .trim()
        .split("\n")
        .map((line) => line.split(" "))
        .map(([name, r, errno]) => [name, { r: Number(r), errno: Number(errno) }]),
    );
    for (const name of [
      "finit_module",
      "init_module",
      "delete_module",
      "kexec_load",
      "reboot",
      "bpf",
      "swapoff",
      "settimeofday",
      "keyctl",
      "unshare_net",
      "setns",
      "sethostname",
    ]) {
      expect(results[name], name).toEqual({ r: -1, errno: 1 });
    }
    expect(nodeIsHealthy()).toBe(true);
  });

  it("changing the hostname fails and the host's hostname is unchanged", async () => {
    const attempt = await run(a.sandbox, "hostname evil-host; sudo -n hostname evil-host", "root");
    expect(attempt.exitCode).not.toBe(0);
    expect(hostname()).toBe(originalHostname);
    expect((await run(a.sandbox, "hostname")).stdout.trim()).toBe("sandbox");
  });

  it("a memory bomb is stopped by the memory limit; the node and other sandboxes stay healthy", async () => {
    const c = await start("escapemem", { memoryMb: 256 });
    const bomb = await run(
      c.sandbox,
      "python3 -c \"x = bytearray(700 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); print('allocated')\"",
    );
    expect(bomb.stdout).not.toContain("allocated");
    expect(bomb.exitCode).not.toBe(0);
    const stats = await client.stats({ sandboxId: "escapemem" });
    expect(stats.memoryUsageBytes).toBeLessThanOrEqual(256n * 1024n * 1024n);
    expect(await healthy(b.placement.sandboxAddr, 2000)).toBe(true);
    expect(nodeIsHealthy()).toBe(true);
  });

  it("filling the disk stops at the sandbox's quota; the host disk is untouched", async () => {
    const d = await start("escapedisk", { diskSizeMb: 128 });
    const fill = await run(d.sandbox, "dd if=/dev/zero of=/home/user/fill bs=1M count=400 2>&1");
    expect(fill.exitCode).not.toBe(0);
    expect(fill.stdout).toMatch(/No space left on device/);
    const stats = await client.stats({ sandboxId: "escapedisk" });
    expect(stats.diskLimitBytes).toBe(128n * 1024n * 1024n);
    expect(stats.diskUsageBytes).toBeLessThanOrEqual(stats.diskLimitBytes);
    // The sandbox itself still works after the fill (envd answers, the file can be removed).
    expect((await run(d.sandbox, "rm /home/user/fill && echo ok")).stdout.trim()).toBe("ok");
    expect(nodeIsHealthy()).toBe(true);
  });

  it("a fork bomb hits the pids limit; the node and other sandboxes stay healthy and the sandbox is removed cleanly", async () => {
    const f = await start("escapefork");
    const instanceId = running.agent.get("escapefork")!.instanceId;
    await f.sandbox.commands.run("bash -c ':(){ :|:& };:'", { background: true });
    await new Promise((resolve) => setTimeout(resolve, 5000));
    const stats = await client.stats({ sandboxId: "escapefork" });
    expect(stats.pids).toBeLessThanOrEqual(stats.pidsLimit);
    expect(stats.pidsLimit).toBe(1024);
    expect(await healthy(b.placement.sandboxAddr, 5000)).toBe(true);
    expect(nodeIsHealthy()).toBe(true);
    await client.kill({ sandboxId: "escapefork" });
    created.delete("escapefork");
    const traces = await tracesAfterReclaim(config, { sandboxId: "escapefork", instanceId, slot: f.slot.index }, redis);
    expect(traces).toEqual(NO_TRACES);
  });
});
