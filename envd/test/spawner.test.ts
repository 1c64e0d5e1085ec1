// envd's command spawner (`warren-exec --serve`, platform/src/spawner.ts): commands are forked by it, not by envd,
// and behave exactly as when envd forks them itself (ENVD_SPAWNER=0), through the official e2b SDK.
import { execFileSync } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmdirSync,
} from "node:fs";
import { fileURLToPath } from "node:url";
import { decodeWaitStatus } from "@warren/platform/spawner";
import { CommandExitError, type Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sdkSandbox, startTestEnvd, type TestEnvd, WARREN_EXEC } from "./harness.js";

const cmdline = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ");
const parentOf = (pid: number) => Number(/^PPid:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);

describe.each([
  { name: "the spawner", env: {}, beside: false },
  { name: "the spawner started before envd (warren-exec --serve-beside)", env: {}, beside: true },
  { name: "envd itself (ENVD_SPAWNER=0)", env: { ENVD_SPAWNER: "0" }, beside: false },
])("commands forked by $name", ({ env, beside }) => {
  let envd: TestEnvd;
  let sandbox: Sandbox;

  beforeAll(async () => {
    envd = await startTestEnvd({ env, spawnerBeside: beside });
    sandbox = sdkSandbox(envd);
  });

  afterAll(async () => {
    await envd?.stop();
  });

  it("have the parent this mode gives them, their own session, the top OOM score and the user's identity", async () => {
    const handle = await sandbox.commands.run("sleep 30", { background: true });
    try {
      const parent = parentOf(handle.pid);
      if (env.ENVD_SPAWNER === "0") {
        expect(parent).toBe(envd.child.pid);
      } else {
        // Beside: forked by warren-exec before it exec'd envd (same pid); its command line is not envd's.
        expect(cmdline(parent)).toMatch(beside ? /warren-exec --serve-beside$/ : /warren-exec --serve$/);
        expect(parentOf(parent)).toBe(envd.child.pid);
        expect(cmdline(envd.child.pid)).toMatch(/envd\.cjs/);
      }
      // envd's own descriptors stay envd's: the command's environment does not name them.
      const environ = readFileSync(`/proc/${handle.pid}/environ`, "utf8");
      expect(environ).not.toContain("WARREN_SPAWNER");
      // The pid is reported once the child is forked; it sets its session, OOM score and identity itself right
      // after, before it execs the command (warren-exec.c `become`), so a look this early may come before that.
      const uid = execFileSync("id", ["-u", "user"], { encoding: "utf8" }).trim();
      const identity = () => {
        const stat = readFileSync(`/proc/${handle.pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
        return {
          // Fields after the command: state, ppid, pgrp, session: the command leads both.
          group: [Number(stat[2]), Number(stat[3])],
          oom: readFileSync(`/proc/${handle.pid}/oom_score_adj`, "utf8").trim(),
          uid: /^Uid:\s+(\d+)\s/m.exec(readFileSync(`/proc/${handle.pid}/status`, "utf8"))?.[1],
        };
      };
      await expect.poll(identity).toEqual({ group: [handle.pid, handle.pid], oom: "1000", uid });
    } finally {
      await handle.kill();
    }
  });

  it("pass output, stdin, exit codes, signals, cwd and environment through", async () => {
    const out = await sandbox.commands.run("pwd; echo $MINE; echo err >&2", { cwd: "/tmp", envs: { MINE: "x y" } });
    expect([out.stdout, out.stderr, out.exitCode]).toEqual(["/tmp\nx y\n", "err\n", 0]);
    const failed = await sandbox.commands.run("exit 3").catch((error: unknown) => error);
    expect(failed).toBeInstanceOf(CommandExitError);
    expect((failed as CommandExitError).exitCode).toBe(3);
    const killed = await sandbox.commands.run("kill -TERM $$").catch((error: unknown) => error);
    expect((failed as CommandExitError).error).toBe("exit status 3");
    expect((killed as CommandExitError).error).toBe("signal: terminated");
    const cat = await sandbox.commands.run("cat", { background: true, stdin: true });
    await sandbox.commands.sendStdin(cat.pid, "hello\n");
    await sandbox.commands.closeStdin(cat.pid);
    expect((await cat.wait()).stdout).toBe("hello\n");
    // Output larger than a pipe holds, from a command that exits at once: nothing lost.
    const big = await sandbox.commands.run("head -c 300000 /dev/zero | tr '\\0' a");
    expect(big.stdout.length).toBe(300_000);
    // A command that is not there: 127 from the shell, as before.
    const missing = await sandbox.commands.run("no-such-command-here").catch((error: unknown) => error);
    expect((missing as CommandExitError).exitCode).toBe(127);
  });

  it("start back to back and concurrently, every one reported once", async () => {
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) => sandbox.commands.run(`echo ${i}`).then((r) => r.stdout.trim())),
    );
    expect(results).toEqual(Array.from({ length: 40 }, (_, i) => String(i)));
  });
});

describe("the spawner's wait status", () => {
  it("decodes exits and signals as Node reports them", () => {
    expect(decodeWaitStatus(0)).toEqual({ code: 0, signal: null });
    expect(decodeWaitStatus(3 << 8)).toEqual({ code: 3, signal: null });
    expect(decodeWaitStatus(9)).toEqual({ code: null, signal: "SIGKILL" });
    expect(decodeWaitStatus(15 | 0x80)).toEqual({ code: null, signal: "SIGTERM" });
  });
});

describe.each([
  { name: "the spawner", beside: false },
  { name: "the spawner started before envd", beside: true },
])("when $name dies", ({ beside }) => {
  it("envd forks commands itself from then on", async () => {
    const envd = await startTestEnvd({ spawnerBeside: beside });
    try {
      const sandbox = sdkSandbox(envd);
      const first = await sandbox.commands.run("sleep 30", { background: true });
      const spawnerPid = parentOf(first.pid);
      expect(cmdline(spawnerPid)).toMatch(beside ? /warren-exec --serve-beside$/ : /warren-exec --serve$/);
      process.kill(spawnerPid, "SIGKILL");
      await first.kill();
      const deadline = Date.now() + 5_000;
      while (!envd.logs().includes("the command spawner ended") && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect((await sandbox.commands.run("echo still")).stdout).toBe("still\n");
      const next = await sandbox.commands.run("sleep 30", { background: true });
      expect(parentOf(next.pid)).toBe(envd.child.pid);
      await next.kill();
    } finally {
      await envd.stop();
    }
  });
});

// A real cgroup v1 memory hierarchy, as a sandbox's node makes it (the tests run as root).
describe.each([
  { name: "a spawner given the workload (--serve-beside --workload-fd)", env: {}, beside: true, joinsItself: true },
  { name: "envd itself (ENVD_SPAWNER=0)", env: { ENVD_SPAWNER: "0" }, beside: false, joinsItself: false },
])("the workload cgroup, commands forked by $name", ({ env, beside, joinsItself }) => {
  const dir = `/sys/fs/cgroup/memory/warren-spawner-test-${process.pid}-${beside ? "beside" : "envd"}`;
  let procsFd: number;
  let envd: TestEnvd;
  let sandbox: Sandbox;

  beforeAll(async () => {
    mkdirSync(dir);
    procsFd = openSync(`${dir}/cgroup.procs`, "a");
    envd = await startTestEnvd({ env, spawnerBeside: beside, workloadProcsFd: procsFd });
    sandbox = sdkSandbox(envd);
  });

  afterAll(async () => {
    await envd?.stop();
    closeSync(procsFd);
    await removeCgroupOnceEmpty(dir);
  });

  it("holds each command and what it forks; neither envd nor the spawner, and no command holds its file", async () => {
    const inside = () => readFileSync(`${dir}/cgroup.procs`, "utf8").split("\n").filter(Boolean).map(Number);
    // A child forked at once, before envd could have moved its parent: inside either way.
    const handle = await sandbox.commands.run("sleep 30 & wait", { background: true });
    try {
      // Settled once the shell waits on its `sleep` (its login profile may fork and open files until then).
      const sleeping = () =>
        inside().filter((pid) => pid !== handle.pid && alive(pid) && /^sleep 30/.test(cmdline(pid)));
      await expect.poll(() => sleeping().length).toBe(1);
      expect(inside().filter(alive).sort()).toEqual([handle.pid, ...sleeping()].sort());
      expect(inside()).not.toContain(envd.child.pid);
      expect(inside()).not.toContain(parentOf(handle.pid));
      if (joinsItself) expect(cmdline(parentOf(handle.pid))).toMatch(/warren-exec --serve-beside$/);
      // Only the pipes (0-2) and the shell's own script: no descriptor of the cgroup's.
      const fds = readdirSync(`/proc/${handle.pid}/fd`).flatMap((fd) => {
        try {
          return [readlinkSync(`/proc/${handle.pid}/fd/${fd}`)];
        } catch {
          return []; // closed between the listing and the look
        }
      });
      expect(fds.filter((target) => target.includes("cgroup"))).toEqual([]);
      expect(envd.logs()).not.toContain("could not join the workload");
      expect(envd.logs()).not.toContain("could not move a process into the workload");
    } finally {
      await handle.kill();
    }
    // Back to back, every command is in it while it runs.
    for (let i = 0; i < 5; i++) {
      const own = await sandbox.commands.run("cat /proc/self/cgroup | grep memory");
      expect(own.stdout.trim()).toMatch(new RegExp(`:memory:/warren-spawner-test-${process.pid}-`));
    }
  });
});

describe("a spawner given the workload (--serve-beside --workload-fd)", () => {
  const dir = `/sys/fs/cgroup/memory/warren-spawner-test-${process.pid}-first`;

  afterAll(async () => {
    await removeCgroupOnceEmpty(dir);
  });

  it("has each command join it before it execs: nobody moves it later, yet its first look finds it inside", () => {
    mkdirSync(dir);
    const procsFd = openSync(`${dir}/cgroup.procs`, "a");
    // The spawner's user, without envd: a script that only asks it for `cat /proc/self/cgroup` and a host tool.
    const module = (name: string) =>
      JSON.stringify(fileURLToPath(new URL(`../../platform/dist/${name}.js`, import.meta.url)));
    const script = `
      import { Spawner, parseInheritedSpawner } from ${module("spawner")};
      import { createLogger } from ${module("log")};
      const spawner = Spawner.start(${JSON.stringify(WARREN_EXEC)}, createLogger("test"), parseInheritedSpawner(process.env.WARREN_SPAWNER));
      const run = async (hostTool) => {
        const child = await spawner.spawn({ argv: ["/bin/cat", "/proc/self/cgroup"], env: {}, cwd: "/", stdin: false, hostTool });
        let out = "";
        child.stdout.setEncoding("utf8").on("data", (chunk) => { out += chunk; });
        await Promise.all([child.exited, new Promise((resolve) => child.stdout.once("close", resolve))]);
        return { inWorkload: child.inWorkload, memory: /:memory:(.*)$/m.exec(out)?.[1] };
      };
      console.log(JSON.stringify([await run(false), await run(true)]));
      spawner.close();`;
    try {
      const out = execFileSync(
        WARREN_EXEC,
        ["--serve-beside", "--workload-fd=3", "--", process.execPath, "--input-type=module", "-e", script],
        { encoding: "utf8", stdio: ["ignore", "pipe", "inherit", procsFd] },
      );
      const [command, hostTool] = JSON.parse(out);
      expect(command).toEqual({ inWorkload: true, memory: `/warren-spawner-test-${process.pid}-first` });
      // A host tool (the node agent's) stays where the spawner is.
      expect(hostTool.inWorkload).toBe(false);
      expect(hostTool.memory).not.toContain("warren-spawner-test");
    } finally {
      closeSync(procsFd);
    }
  });

  it("refuses a workload descriptor that is not open, or one of 0-2", () => {
    const refusal = (fd: number) => {
      try {
        execFileSync(WARREN_EXEC, ["--serve-beside", `--workload-fd=${fd}`, "--", "/bin/true"], { stdio: "pipe" });
        return undefined;
      } catch (error) {
        return error as { status: number; stderr: Buffer };
      }
    };
    const failed = refusal(57);
    expect(failed?.status).toBe(126);
    expect(failed?.stderr.toString()).toMatch(/--workload-fd: Bad file descriptor/);
    const low = refusal(1);
    expect(low?.status).toBe(127);
    expect(low?.stderr.toString()).toMatch(/--workload-fd must be 3 or more/);
  });
});

/** Whether `pid` still runs (a process that exited may linger in cgroup.procs until reaped). */
function alive(pid: number): boolean {
  try {
    return !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, "utf8"));
  } catch {
    return false;
  }
}

/** Removes a test's cgroup once its last process has left (a killed command's group takes a moment). */
async function removeCgroupOnceEmpty(dir: string): Promise<void> {
  if (!existsSync(dir)) return;
  const deadline = Date.now() + 5_000;
  while (readFileSync(`${dir}/cgroup.procs`, "utf8") !== "" && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  rmdirSync(dir);
}
