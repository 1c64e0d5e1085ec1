import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import { NotEnoughSpaceError, Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Disk, memory and pids are separate budgets (issue 18), through the whole cluster (one namespace node agent),
// driven by the official e2b SDK. The node's side of each sandbox (its cgroups, its disk image) is read on the
// host, as an operator would.
const dataDir = mkdtempSync(join(tmpdir(), "warren-budgets-"));
const INSTANCE = "bqa";
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "bq",
  nodeCidr: () => "10.229.0.0/22",
  env: { WARREN_UPLINK_FORWARDING: "0", WARREN_DNS_UPSTREAM: "127.0.0.1:9" },
});

const MiB = 1024 * 1024;

beforeAll(async () => {
  const env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 900_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

/** The node's instance directory of a sandbox (its record carries the sandbox id). */
function instanceOf(sandboxId: string): { instanceId: string; dir: string } {
  const root = join(dataDir, `agent-${INSTANCE}`, "instances");
  for (const instanceId of readdirSync(root)) {
    const file = join(root, instanceId, "instance.json");
    if (!existsSync(file)) continue;
    const record = JSON.parse(readFileSync(file, "utf8")) as { labels: Record<string, string> };
    if (record.labels.sandboxId === sandboxId) return { instanceId, dir: join(root, instanceId) };
  }
  throw new Error(`no instance of sandbox '${sandboxId}'`);
}

const cgroupFile = (controller: string, instanceId: string, file: string) =>
  readFileSync(join("/sys/fs/cgroup", controller, "warren", INSTANCE, instanceId, file), "utf8");

/** Anonymous and shared memory (tmpfs pages) of a sandbox's memory cgroup: what page cache reclaim cannot take. */
function unreclaimableBytes(instanceId: string): number {
  const stat = cgroupFile("memory", instanceId, "memory.stat");
  const field = (name: string) => Number(new RegExp(`^${name} (\\d+)$`, "m").exec(stat)?.[1] ?? Number.NaN);
  return field("total_rss") + field("total_shmem");
}

async function events(sandboxId: string): Promise<{ type: string; data?: unknown }[]> {
  const res = await fetch(`${process.env.E2B_API_URL}/warren/v1/sandboxes/${sandboxId}/events`, {
    headers: { "X-API-KEY": process.env.E2B_API_KEY as string },
  });
  return ((await res.json()) as { events: { type: string; data?: unknown }[] }).events;
}

async function eventually<T>(probe: () => Promise<T | undefined> | T | undefined, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

describe("disk", () => {
  it("filling the disk as `user` gives the writer ENOSPC; the sandbox runs on, no OOM, its memory holds no file data", async () => {
    const sandbox = await Sandbox.create();
    try {
      const { instanceId, dir } = instanceOf(sandbox.sandboxId);
      const memoryLimit = Number(cgroupFile("memory", instanceId, "memory.limit_in_bytes"));
      const before = unreclaimableBytes(instanceId);
      // Twice the memory limit would be asked for; the base template's disk (1024 MiB) ends it first.
      const fill = await sandbox.commands.run(
        `dd if=/dev/zero of=/home/user/fill bs=1M count=${(2 * memoryLimit) / MiB} 2>&1; echo "exit=$?"; sync; stat -c %s /home/user/fill`,
        { timeoutMs: 120_000 },
      );
      expect(fill.stdout).toMatch(/No space left on device/);
      expect(fill.stdout).toMatch(/exit=1/);
      const written = Number(fill.stdout.trim().split("\n").at(-1));
      expect(written).toBeGreaterThan(memoryLimit);
      // The file is on the node's disk (the sandbox's image file holds its blocks), not in the sandbox's memory.
      expect(statSync(join(dir, "disk.img")).blocks * 512).toBeGreaterThan(written);
      expect(unreclaimableBytes(instanceId) - before).toBeLessThan(64 * MiB);
      expect(cgroupFile("memory", instanceId, "memory.oom_control")).toMatch(/^oom_kill 0$/m);

      expect((await Sandbox.getInfo(sandbox.sandboxId)).state).toBe("running");
      expect((await sandbox.commands.run("echo ok")).stdout).toBe("ok\n");
      // An upload that does not fit is E2B's 507, which the SDK raises as NotEnoughSpaceError.
      await expect(sandbox.files.write("/home/user/more.bin", new Uint8Array(16 * MiB).buffer)).rejects.toBeInstanceOf(
        NotEnoughSpaceError,
      );
      // Space freed is space again.
      await sandbox.commands.run("rm /home/user/fill");
      await sandbox.files.write("/home/user/more.bin", new Uint8Array(16 * MiB).buffer);
      expect((await sandbox.commands.run("stat -c %s /home/user/more.bin")).stdout.trim()).toBe(String(16 * MiB));
      expect((await events(sandbox.sandboxId)).map((e) => e.type)).not.toContain("sandbox.oom");
    } finally {
      await sandbox.kill();
    }
  }, 300_000);
});

/** The command lines (arguments joined by spaces) of the host pids in a cgroup.procs of the sandbox's. */
function commandLines(instanceId: string, procs: string): string[] {
  return cgroupFile("memory", instanceId, procs)
    .split("\n")
    .filter(Boolean)
    .map((pid) => readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ").trim());
}

describe("memory", () => {
  it("envd keeps a reserve: what it starts runs in the workload cgroup, where a memory bomb as root is killed while envd goes on", async () => {
    const sandbox = await Sandbox.create();
    try {
      const { instanceId } = instanceOf(sandbox.sandboxId);
      await sandbox.commands.run("sleep 600", { background: true });
      // The sandbox's 512 MiB less envd's reserve (an eighth).
      expect(Number(cgroupFile("memory", instanceId, "workload/memory.limit_in_bytes"))).toBe(448 * MiB);
      // The command's shell, or the sleep it became. The start event comes with the pid, which may still be the
      // launcher's fork, before its exec (a CI run once looked that soon).
      await eventually(
        () => commandLines(instanceId, "workload/cgroup.procs").some((line) => line.endsWith("sleep 600")) || undefined,
        10_000,
      );
      const own = commandLines(instanceId, "cgroup.procs");
      const envd = own.find((line) => line.includes("/opt/warren/envd/"));
      expect(envd).toBeDefined();
      expect(own.some((line) => line.includes("sleep"))).toBe(false);

      const outcome = await sandbox.commands.run("python3 -c 'b = bytearray(3 * 1024 ** 3)'", { user: "root" }).then(
        () => "exited",
        (error: unknown) => String(error),
      );
      // envd saw the workload's OOM count rise: the command's error (E2B's CommandExitError) says why.
      expect(outcome).toMatch(/signal: killed \(out of memory: the sandbox's processes reached its memory limit\)/);
      // A command killed on request is not called out of memory.
      const sleeper = await sandbox.commands.run("sleep 600", { background: true });
      await sandbox.commands.kill(sleeper.pid);
      expect(String((await sleeper.wait().catch((error: unknown) => error)) as unknown)).not.toMatch(/out of memory/);
      // Killed in the workload; the sandbox's own cgroup (envd's) never reached its limit.
      expect(cgroupFile("memory", instanceId, "workload/memory.oom_control")).toMatch(/^oom_kill [1-9]/m);
      expect(cgroupFile("memory", instanceId, "memory.oom_control")).toMatch(/^oom_kill 0$/m);
      expect(commandLines(instanceId, "cgroup.procs")).toContain(envd);
      expect((await sandbox.commands.run("echo alive")).stdout).toBe("alive\n");
      // The ledger names the victim from the kernel's log: the process and the memory it held.
      const oom = await eventually(
        async () => (await events(sandbox.sandboxId)).find((e) => e.type === "sandbox.oom"),
        60_000,
      );
      const victims = (oom.data as { victims?: { process: string; memoryMB: number }[] }).victims ?? [];
      expect(victims.map((v) => v.process)).toContain("python3");
      expect(Math.max(...victims.map((v) => v.memoryMB))).toBeGreaterThan(256);
    } finally {
      await sandbox.kill();
    }
  }, 120_000);
});

describe("pids", () => {
  it("a fork bomb stops short of the pids limit: envd still starts a command, kills the bomb, and the sandbox recovers", async () => {
    const sandbox = await Sandbox.create();
    try {
      const { instanceId } = instanceOf(sandbox.sandboxId);
      const pidsMax = Number(cgroupFile("pids", instanceId, "pids.max"));
      const pids = () => Number(cgroupFile("pids", instanceId, "pids.current"));
      // A bomb that holds what it forks (a `:(){ :|:& };:` thins out as its forks fail), bounded by its count.
      const bomb = await sandbox.commands.run(
        "bash -c 'for j in $(seq 16); do (for i in $(seq 256); do sleep 600 & done; wait) & done; wait'",
        { background: true },
      );
      // The bomb grows until its user's process limit, an eighth of the pids limit short of it.
      let peak = 0;
      await eventually(() => {
        peak = Math.max(peak, pids());
        return peak >= pidsMax * 0.8 ? true : undefined;
      }, 120_000);
      for (let i = 0; i < 10; i++) {
        peak = Math.max(peak, pids());
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      expect(peak).toBeLessThan(pidsMax);
      expect(pids()).toBeGreaterThanOrEqual(pidsMax * 0.8);
      // The bomb's uid is at its limit; a command as root still starts, and can see the bomb.
      const count = await sandbox.commands.run("ps -e --no-headers | wc -l", { user: "root", timeoutMs: 30_000 });
      expect(Number(count.stdout.trim())).toBeGreaterThan(pidsMax / 2);
      expect(await sandbox.commands.kill(bomb.pid)).toBe(true);
      await eventually(() => (pids() < 32 ? true : undefined), 60_000);
      expect((await sandbox.commands.run("echo ok")).stdout).toBe("ok\n");

      // The classic bomb (it may thin out by itself as its forks fail): ended by one kill of its process group.
      const classic = await sandbox.commands.run("bash -c ':(){ :|:& };:'", { background: true });
      await eventually(() => (pids() >= pidsMax / 2 ? true : undefined), 60_000);
      await sandbox.commands.kill(classic.pid);
      await eventually(() => (pids() < 32 ? true : undefined), 60_000);
      expect((await sandbox.commands.run("echo ok")).stdout).toBe("ok\n");
      expect((await Sandbox.getInfo(sandbox.sandboxId)).state).toBe("running");
    } finally {
      await sandbox.kill();
    }
  }, 300_000);

  it("a bomb as root (sudo) stops at the same limit: a command as `user` still starts and forks, commands.kill ends the bomb", async () => {
    const sandbox = await Sandbox.create();
    try {
      const { instanceId } = instanceOf(sandbox.sandboxId);
      const pidsMax = Number(cgroupFile("pids", instanceId, "pids.max"));
      const pids = () => Number(cgroupFile("pids", instanceId, "pids.current"));
      // sudo cannot raise the hard limit envd set (that takes CAP_SYS_RESOURCE on the host), and root's count
      // includes envd's own processes.
      expect((await sandbox.commands.run("sudo bash -c 'ulimit -Hu'")).stdout.trim()).toBe(
        (await sandbox.commands.run("ulimit -Hu")).stdout.trim(),
      );
      const bomb = await sandbox.commands.run(
        "sudo bash -c 'for j in $(seq 16); do (for i in $(seq 256); do sleep 600 & done; wait) & done; wait'",
        { background: true },
      );
      let peak = 0;
      await eventually(() => {
        peak = Math.max(peak, pids());
        return peak >= pidsMax * 0.8 ? true : undefined;
      }, 120_000);
      for (let i = 0; i < 10; i++) {
        peak = Math.max(peak, pids());
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      expect(peak).toBeLessThan(pidsMax);
      // Root's uid is at its limit; `user`'s is not, and the cgroup has room.
      expect((await sandbox.commands.run("echo ok | cat", { timeoutMs: 30_000 })).stdout).toBe("ok\n");
      expect(await sandbox.commands.kill(bomb.pid)).toBe(true);
      await eventually(() => (pids() < 32 ? true : undefined), 60_000);
      expect((await sandbox.commands.run("echo ok", { user: "root" })).stdout).toBe("ok\n");
    } finally {
      await sandbox.kill();
    }
  }, 300_000);
});
