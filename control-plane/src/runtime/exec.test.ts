import { readFileSync } from "node:fs";
import { join } from "node:path";
import { silentLogger } from "@warren/platform/log";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExecError, exec, useToolSpawner } from "./exec.js";

const LAUNCHER = join(import.meta.dirname, "../../../envd/dist/warren-exec");
const parentOf = (pid: number) => Number(/^PPid:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);
const oomScoreAdj = (pid: number) => Number(readFileSync(`/proc/${pid}/oom_score_adj`, "utf8"));

/** What a tool reports about itself: its pid and its parent's, read by a shell. */
async function whoRuns(): Promise<{ pid: number; parent: number }> {
  const { stdout } = await exec("sh", ["-c", 'echo "$$ $PPID"']);
  const [pid, parent] = stdout.trim().split(" ").map(Number) as [number, number];
  return { pid, parent };
}

describe.each([
  { name: "through the tool spawner", spawner: true },
  { name: "forked by this process", spawner: false },
])("host tools $name", ({ spawner }) => {
  let release: (() => void) | undefined;
  beforeAll(() => {
    if (spawner) release = useToolSpawner(LAUNCHER, silentLogger);
  });
  afterAll(() => release?.());

  it("run with the tools' PATH, their output, input and exit status as before", async () => {
    const ok = await exec("sh", ["-c", 'cat; echo "to stderr" >&2; echo "$PATH"'], { input: "from stdin\n" });
    expect(ok).toEqual({
      code: 0,
      stdout: "from stdin\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
      stderr: "to stderr\n",
    });
    const lines: string[] = [];
    await exec("sh", ["-c", "echo one; echo two >&2"], { onLine: (line) => lines.push(line) });
    expect(lines.sort()).toEqual(["one", "two"]);
    const failed = await exec("sh", ["-c", "echo no >&2; exit 3"], { allowFailure: true });
    expect(failed).toMatchObject({ code: 3, stderr: "no\n" });
    const error = await exec("sh", ["-c", "echo why >&2; exit 4"]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ExecError);
    expect((error as ExecError).message).toContain("exited with 4: why");
    expect((await exec("sh", ["-c", 'echo "$EXTRA"'], { env: { EXTRA: "x" } })).stdout).toBe("x\n");
  });

  it("end at their timeout with the kill signal asked for", async () => {
    const started = Date.now();
    const result = await exec("sleep", ["30"], { timeoutMs: 200, killSignal: "SIGKILL", allowFailure: true });
    expect(result.code).not.toBe(0);
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it("a tool that is not installed fails as spawn's ENOENT", async () => {
    await expect(exec("warren-no-such-tool", [])).rejects.toMatchObject({ code: "ENOENT" });
  });

  it(
    spawner
      ? "are the spawner's children, not this process's, and keep its OOM score (not a sandbox command's 1000)"
      : "are this process's children",
    async () => {
      const { pid, parent } = await whoRuns();
      expect(pid).toBeGreaterThan(0);
      if (spawner) {
        expect(parent).not.toBe(process.pid);
        expect(parentOf(parent)).toBe(process.pid);
        expect(readFileSync(`/proc/${parent}/cmdline`, "utf8")).toContain("--serve");
        // A tool of the agent (crun among them: a sandbox's init inherits it) is not the OOM killer's first pick.
        const { stdout } = await exec("sh", ["-c", "cat /proc/self/oom_score_adj"]);
        expect(Number(stdout)).toBe(oomScoreAdj(process.pid));
      } else {
        expect(parent).toBe(process.pid);
      }
    },
  );
});

describe("the tool spawner's users", () => {
  it("keep it through a SIGTERM to their process group (a stopping agent's teardown still runs its tools)", async () => {
    const release = useToolSpawner(LAUNCHER, silentLogger);
    try {
      const spawnerPid = (await whoRuns()).parent;
      const slow = exec("sh", ["-c", "sleep 0.3; echo finished"]);
      process.kill(spawnerPid, "SIGTERM");
      process.kill(spawnerPid, "SIGHUP");
      expect(await slow).toMatchObject({ code: 0, stdout: "finished\n" });
      expect((await whoRuns()).parent).toBe(spawnerPid);
    } finally {
      release();
    }
  });

  it("share one spawner; it stops when the last lets go, and tools are forked by this process again", async () => {
    const first = useToolSpawner(LAUNCHER, silentLogger);
    const second = useToolSpawner(LAUNCHER, silentLogger);
    const spawnerPid = (await whoRuns()).parent;
    expect(spawnerPid).not.toBe(process.pid);
    first();
    first(); // a second release of the same user changes nothing
    expect((await whoRuns()).parent).toBe(spawnerPid);
    second();
    expect((await whoRuns()).parent).toBe(process.pid);
  });
});
