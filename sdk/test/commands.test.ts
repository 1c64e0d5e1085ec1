import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { CommandExitError, NotFoundError, type Sandbox, TimeoutError } from "../src/index.js";
import { startEnvd, type TestEnvd, until, warrenSandbox } from "./harness.js";

let envd: TestEnvd;
let sandbox: Sandbox;

beforeAll(async () => {
  envd = await startEnvd({ accessToken: "cmd-token" });
  sandbox = warrenSandbox(envd.url, { accessToken: "cmd-token" });
});
afterAll(async () => {
  await envd?.stop();
});

describe("commands", () => {
  test("run in the foreground returns stdout, stderr and exit code of the command", async () => {
    const result = await sandbox.commands.run("echo out; echo err >&2; whoami");
    expect(result).toEqual({ exitCode: 0, stdout: "out\nuser\n", stderr: "err\n" });
  });

  test("a non-zero exit throws CommandExitError carrying the output", async () => {
    const error = await sandbox.commands.run("echo partial; exit 3").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect((error as CommandExitError).exitCode).toBe(3);
    expect((error as CommandExitError).stdout).toBe("partial\n");
    expect((error as CommandExitError).error).toBe("exit status 3");
  });

  test("onStdout and onStderr stream every chunk as it is produced", async () => {
    const out: string[] = [];
    const err: string[] = [];
    await sandbox.commands.run("for i in 1 2 3; do echo o$i; echo e$i >&2; done", {
      onStdout: (d) => void out.push(d),
      onStderr: (d) => void err.push(d),
    });
    expect(out.join("")).toBe("o1\no2\no3\n");
    expect(err.join("")).toBe("e1\ne2\ne3\n");
  });

  test("user, cwd and envs are applied to the command", async () => {
    const result = await sandbox.commands.run('echo "$(whoami) $(pwd) $FOO"', {
      user: "root",
      cwd: "/tmp",
      envs: { FOO: "bar" },
    });
    expect(result.stdout).toBe("root /tmp bar\n");
  });

  test("a background command returns a handle whose wait() gives the result", async () => {
    const handle = await sandbox.commands.run("sleep 0.2; echo done", { background: true });
    expect(handle.pid).toBeGreaterThan(0);
    const result = await handle.wait();
    expect(result.stdout).toBe("done\n");
    expect(handle.exitCode).toBe(0);
  });

  test("stdin: sendStdin feeds the command and closeStdin ends it with EOF", async () => {
    const handle = await sandbox.commands.run("cat", { background: true, stdin: true });
    await handle.sendStdin("hello ");
    await sandbox.commands.sendStdin(handle.pid, new TextEncoder().encode("world\n"));
    await handle.closeStdin();
    const result = await handle.wait();
    expect(result.stdout).toBe("hello world\n");
  });

  test("kill ends a running command; wait() reports the signal; killing an unknown pid is false", async () => {
    const handle = await sandbox.commands.run("sleep 600", { background: true });
    expect(await handle.kill()).toBe(true);
    const error = await handle.wait().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect((error as CommandExitError).error).toBe("signal: killed");
    expect(await sandbox.commands.kill(999_999)).toBe(false);
  });

  test("list shows running commands with their pid and command line", async () => {
    const handle = await sandbox.commands.run("sleep 600", { background: true });
    const listed = await sandbox.commands.list();
    const entry = listed.find((p) => p.pid === handle.pid);
    expect(entry).toMatchObject({ cmd: "/bin/bash", args: ["-l", "-c", "sleep 600"] });
    await handle.kill();
  });

  test("disconnect leaves the command running and connect(pid) receives its later output", async () => {
    const handle = await sandbox.commands.run("read line; echo got $line", { background: true, stdin: true });
    await handle.disconnect();
    const seen: string[] = [];
    const attached = await sandbox.commands.connect(handle.pid, { onStdout: (d) => void seen.push(d) });
    await sandbox.commands.sendStdin(handle.pid, "x\n");
    const result = await attached.wait();
    expect(result.stdout).toBe("got x\n");
    expect(seen.join("")).toBe("got x\n");
  });

  test("connect to an unknown pid throws NotFoundError", async () => {
    await expect(sandbox.commands.connect(999_999)).rejects.toBeInstanceOf(NotFoundError);
  });

  test("the caller's own timeoutMs kills the command and throws TimeoutError", async () => {
    const handle = await sandbox.commands.run("sleep 600", { background: true, timeoutMs: 500 });
    await expect(handle.wait()).rejects.toBeInstanceOf(TimeoutError);
    await until(
      async () => !(await sandbox.commands.list()).some((p) => p.pid === handle.pid),
      "the command to be killed",
    );
  });
});
