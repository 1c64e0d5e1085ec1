import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

// envd's launcher as `npm run build` makes it (envd/native/warren-exec.c → envd/dist/warren-exec), run as root the
// way envd runs it: the numbers are made up, so no account lookup can hide in them.
const LAUNCHER = fileURLToPath(new URL("../dist/warren-exec", import.meta.url));

function launch(args: readonly string[]) {
  const result = spawnSync(LAUNCHER, args, { encoding: "utf8" });
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

describe("warren-exec", () => {
  it("is built, statically (it runs in any image whatever its libc)", () => {
    expect(existsSync(LAUNCHER)).toBe(true);
    const ldd = spawnSync("ldd", [LAUNCHER], { encoding: "utf8" });
    expect(`${ldd.stdout}${ldd.stderr}`).toMatch(/not a dynamic executable|statically linked/);
  });

  it("sets the process limit (soft and hard), the groups, the gid and the uid, then execs the command", () => {
    const script = `id -u; id -g; id -G; grep 'Max processes' /proc/self/limits`;
    const out = launch(["--nproc=37", "--uid=4242", "--gid=4243", "--groups=4243,27", "--", "/bin/sh", "-c", script]);
    expect(out.stderr).toBe("");
    expect(out.status).toBe(0);
    const [uid, gid, groups, limits] = out.stdout.trim().split("\n");
    expect([uid, gid, groups]).toEqual(["4242", "4243", "4243 27"]);
    expect(limits?.split(/\s+/).slice(2, 4)).toEqual(["37", "37"]);
  });

  it("the user it became cannot raise the hard limit or regain root", () => {
    const raise = launch([
      "--nproc=37",
      "--uid=4242",
      "--gid=4242",
      "--groups=",
      "--",
      "/usr/bin/prlimit",
      "--nproc=99:99",
      "/bin/true",
    ]);
    expect(raise.status).not.toBe(0);
    expect(raise.stderr).toMatch(/Operation not permitted/);
    const root = launch([
      "--uid=4242",
      "--gid=4242",
      "--groups=",
      "--",
      "/bin/sh",
      "-c",
      "id -G; cat /proc/self/status | grep -E '^(Uid|Gid)'",
    ]);
    expect(root.stdout).toMatch(/^4242\nUid:\t4242\t4242\t4242\t4242\nGid:\t4242\t4242\t4242\t4242\n$/);
  });

  it("root keeps its identity when only a limit is asked for", () => {
    const out = launch(["--nproc=50", "--", "/bin/sh", "-c", "id -u"]);
    expect(out).toEqual({ status: 0, stdout: "0\n", stderr: "" });
  });

  it("says what is wrong, with a shell's statuses: 127 for usage and a missing command, 126 for one it cannot run", () => {
    expect(launch(["--bogus", "--", "/bin/true"])).toEqual({
      status: 127,
      stdout: "",
      stderr: "warren-exec: unknown option: --bogus\n",
    });
    expect(launch(["--nproc=-1", "--", "/bin/true"]).stderr).toBe("warren-exec: not a number: --nproc\n");
    expect(launch(["--uid=4242", "--", "/bin/true"]).stderr).toBe(
      "warren-exec: --uid, --gid and --groups go together\n",
    );
    expect(launch(["--nproc=5"]).stderr).toBe("warren-exec: no command after --\n");
    expect(launch(["--", "/nonexistent/command"])).toEqual({
      status: 127,
      stdout: "",
      stderr: "warren-exec: cannot execute: /nonexistent/command: No such file or directory\n",
    });
    expect(launch(["--", "/etc/passwd"])).toMatchObject({
      status: 126,
      stderr: expect.stringMatching(/Permission denied/),
    });
  });
});

describe("warren-exec --launch-sandbox", () => {
  // The node agent's launch of a sandbox whose disk is ready; crun itself runs in the node agent's tests
  // (control-plane/test/node-agent-*.test.ts). Here a stand-in `crun` first in PATH reports what it was given.
  it("moves the ready disk, mounts the overlay root, joins the cgroups, hands over the workload's files, execs crun", () => {
    const root = mkdtempSync(join(tmpdir(), "warren-launch-"));
    const dir = join(root, "instance");
    const ready = join(root, "ready");
    const lower = join(root, "lower");
    const bin = join(root, "bin");
    for (const d of [join(dir, "disk"), join(dir, "rootfs"), ready, lower, bin]) mkdirSync(d, { recursive: true });
    writeFileSync(join(lower, "from-template"), "t");
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "warren-test", ready]);
    mkdirSync(join(ready, "upper"));
    mkdirSync(join(ready, "work"));
    writeFileSync(join(root, "procs-a"), "");
    writeFileSync(join(root, "procs-b"), "");
    writeFileSync(join(root, "workload-procs"), "");
    writeFileSync(join(root, "oom-control"), "oom_kill 0\n");
    writeFileSync(
      join(bin, "crun"),
      `#!/bin/sh\necho "args: $*"\necho "pid: $$"\nls "${dir}/rootfs"\nreadlink /proc/$$/fd/3 /proc/$$/fd/4\n`,
    );
    chmodSync(join(bin, "crun"), 0o755);
    try {
      const run = spawnSync(LAUNCHER, ["--launch-sandbox", dir], {
        encoding: "utf8",
        env: {
          PATH: `${bin}:/usr/bin:/bin`,
          DISK_READY: ready,
          LOWER: lower,
          CGROUP_PROCS: `${join(root, "procs-a")} ${join(root, "procs-b")}`,
          WORKLOAD_PROCS: join(root, "workload-procs"),
          WORKLOAD_OOM_CONTROL: join(root, "oom-control"),
          CRUN_ROOT: join(root, "crun"),
          CID: "warren-test-1",
        },
      });
      expect([run.status, run.stdout, run.stderr]).toEqual([0, "", ""]);
      const log = readFileSync(join(dir, "envd.log"), "utf8").split("\n");
      expect(log[0]).toBe(
        `args: --root ${join(root, "crun")} --cgroup-manager=disabled run --preserve-fds 2 --detach ` +
          `--bundle ${dir}/bundle --pid-file ${dir}/pid warren-test-1`,
      );
      const pid = log[1]?.replace("pid: ", "");
      expect(readFileSync(join(root, "procs-a"), "utf8")).toBe(`${pid}\n`);
      expect(readFileSync(join(root, "procs-b"), "utf8")).toBe(`${pid}\n`);
      expect(log.slice(2, 5)).toEqual(["from-template", join(root, "workload-procs"), join(root, "oom-control")]);
      const mounts = readFileSync("/proc/self/mountinfo", "utf8");
      expect(mounts).toContain(` ${dir}/disk `);
      expect(mounts).toContain(` ${dir}/rootfs `);
      expect(mounts).not.toContain(` ${ready} `);
    } finally {
      for (const point of [join(dir, "rootfs"), join(dir, "disk"), ready]) spawnSync("umount", [point]);
      rmSync(root, { recursive: true, force: true });
    }
  });

  it("says which setting is missing, in envd.log, with a shell's status", () => {
    const dir = mkdtempSync(join(tmpdir(), "warren-launch-"));
    try {
      const run = spawnSync(LAUNCHER, ["--launch-sandbox", dir], { encoding: "utf8", env: { PATH: "/usr/bin:/bin" } });
      expect(run.status).toBe(127);
      expect(readFileSync(join(dir, "envd.log"), "utf8")).toBe(
        "warren-exec: missing environment variable: DISK_TEMPLATE\n",
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
