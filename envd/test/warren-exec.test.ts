import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
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
