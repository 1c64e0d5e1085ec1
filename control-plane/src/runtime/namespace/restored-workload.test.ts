import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { appendFile } from "node:fs/promises";
import { silentLogger } from "@warren/platform/log";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CgroupManager, detectCgroupManager, type SandboxCgroup, workloadMemoryMB } from "./cgroups.js";
import { moveRestoredIntoWorkload } from "./restored-workload.js";

// Real cgroups on this host (the tests run as root): a sandbox cgroup with its workload child, and processes in it
// standing in for a restored tree.
const PARENT = "warren/test-restored-workload";
const NAME = "irestored";

function memoryCgroupOf(pid: number): string {
  const line = readFileSync(`/proc/${pid}/cgroup`, "utf8")
    .split("\n")
    .find((l) => /:(memory)?:/.test(l) && (l.includes(":memory:") || l.startsWith("0::")));
  return line?.split(":")[2] ?? "";
}

describe("a restored sandbox's processes go back into its workload cgroup", () => {
  let cgroups: CgroupManager;
  let cgroup: SandboxCgroup;
  const children: ChildProcess[] = [];

  beforeAll(async () => {
    cgroups = detectCgroupManager(PARENT);
    await cgroups.prepare();
    await cgroups.open(NAME).remove();
    cgroup = await cgroups.create(NAME, { cpuCount: 1, memoryMB: 512, diskSizeMB: 64, pidsMax: 64 });
  });

  afterAll(async () => {
    for (const child of children) child.kill("SIGKILL");
    await cgroup?.killAll();
    await cgroup?.remove();
  });

  /** A `sleep` whose argv[0] is `name`, placed in the sandbox's cgroups as a restore would. */
  async function restored(name: string): Promise<number> {
    const child = spawn("bash", ["-c", `exec -a ${name} sleep 60`], { stdio: "ignore" });
    children.push(child);
    const pid = child.pid as number;
    for (const file of cgroup.procsFiles) await appendFile(file, `${pid}\n`);
    return pid;
  }

  it("the workload has the sandbox's memory less envd's reserve", () => {
    expect(workloadMemoryMB(512)).toBe(448);
    expect(workloadMemoryMB(1024)).toBe(896);
    expect(workloadMemoryMB(8192)).toBe(8064);
    expect(workloadMemoryMB(64)).toBe(32);
  });

  it("moves the user's processes and leaves tini, envd and the gateway where they are", async () => {
    const tini = await restored("/usr/bin/tini");
    const envd = await restored("/opt/warren/envd/dist/envd.cjs");
    const gateway = await restored("/opt/warren/code-gateway/dist/main.js");
    const user = await restored("python3");
    const daemon = await restored("/usr/sbin/nginx");
    // bash has exec'd its argv[0]: wait until each cmdline shows it.
    for (
      let i = 0;
      i < 200 &&
      [tini, envd, gateway, user, daemon].some((p) => readFileSync(`/proc/${p}/cmdline`, "utf8").startsWith("bash"));
      i++
    ) {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }

    expect(await moveRestoredIntoWorkload(cgroup, silentLogger)).toBe(2);
    for (const pid of [user, daemon]) expect(memoryCgroupOf(pid)).toMatch(new RegExp(`/${NAME}/workload$`));
    for (const pid of [tini, envd, gateway]) expect(memoryCgroupOf(pid)).toMatch(new RegExp(`/${NAME}$`));
    expect((await cgroup.outsideWorkload()).sort()).toEqual([tini, envd, gateway].sort());
    // The workload's own limit.
    const limit = readFileSync(cgroup.workloadProcsFile.replace("cgroup.procs", "memory.limit_in_bytes"), "utf8");
    expect(Number(limit)).toBe(448 * 2 ** 20);
  });
});
