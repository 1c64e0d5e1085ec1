// envd's process service driven by the official e2b SDK, as E2B's own js-sdk tests drive a
// sandbox (E2B-PROTOCOL.md §9.1 "Commands / PTY").
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { CommandExitError, InvalidArgumentError, NotFoundError, type Sandbox, TimeoutError } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sdkSandbox, startTestEnvd, type TestEnvd } from "./harness.js";

const ACCESS_TOKEN = `token-${randomBytes(8).toString("hex")}`;
const ENVD_ONLY_VAR = "WARREN_ENVD_ONLY_SECRET";
// A supplementary group of `user`, created for this file and removed after it.
const GROUP = `wtg${randomBytes(4).toString("hex")}`;

let envd: TestEnvd;
let sandbox: Sandbox;

beforeAll(async () => {
  execFileSync("groupadd", [GROUP]);
  execFileSync("gpasswd", ["-a", "user", GROUP], { stdio: "ignore" });
  envd = await startTestEnvd({ accessToken: ACCESS_TOKEN, env: { [ENVD_ONLY_VAR]: "must-not-leak" } });
  sandbox = sdkSandbox(envd, { accessToken: ACCESS_TOKEN });
});

afterAll(async () => {
  await envd?.stop();
  execFileSync("groupdel", [GROUP]);
});

/** Polls until `condition` holds; fails naming `what` after `timeoutMs`. */
async function waitUntil(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Whether `pid` exists, asked from inside the sandbox with another command. */
async function pidAlive(pid: number): Promise<boolean> {
  try {
    await sandbox.commands.run(`kill -0 ${pid}`, { user: "root" });
    return true;
  } catch (error) {
    if (error instanceof CommandExitError) return false;
    throw error;
  }
}

describe("commands.run", () => {
  it("gives every command (and what it forks) the top OOM score, so a memory bomb is killed before envd", async () => {
    const own = (await sandbox.commands.run("cat /proc/self/oom_score_adj")).stdout.trim();
    const forked = (await sandbox.commands.run("sh -c 'cat /proc/self/oom_score_adj'", { user: "root" })).stdout.trim();
    expect([own, forked]).toEqual(["1000", "1000"]);
    const envdScore = (await sandbox.commands.run(`cat /proc/${envd.child.pid}/oom_score_adj`, { user: "root" }))
      .stdout;
    expect(Number(envdScore)).toBeLessThan(1000);
  });

  it("returns stdout of a foreground command, with special characters and several lines", async () => {
    const simple = await sandbox.commands.run("echo 'Hello, World!'");
    expect(simple).toMatchObject({ exitCode: 0, stdout: "Hello, World!\n", stderr: "" });
    expect(simple.error).toBeUndefined();

    const special = await sandbox.commands.run(`printf '%s\\n' '!@#$%^&*()_+ "q" \\ ünï €'`);
    expect(special.stdout).toBe(`!@#$%^&*()_+ "q" \\ ünï €\n`);

    const multiline = await sandbox.commands.run("echo 'Line 1'; echo 'Line 2'; echo 'to stderr' >&2");
    expect(multiline.stdout).toBe("Line 1\nLine 2\n");
    expect(multiline.stderr).toBe("to stderr\n");
  });

  it("throws CommandExitError with the exit code, stderr and Go-style error for a failing command", async () => {
    const error = await sandbox.commands.run("echo partial; echo broken >&2; exit 3").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect(error).toMatchObject({ exitCode: 3, stdout: "partial\n", stderr: "broken\n", error: "exit status 3" });
  });

  it("starts a background command whose handle waits for its result", async () => {
    const handle = await sandbox.commands.run("sleep 0.2; echo finished", { background: true });
    expect(handle.pid).toBeGreaterThan(1);
    const result = await handle.wait();
    expect(result).toMatchObject({ exitCode: 0, stdout: "finished\n" });
  });

  it("passes per-command envs to that command only, on top of the sandbox env, and never envd's own env", async () => {
    const withEnv = await sandbox.commands.run('echo "$FOO/$E2B_SANDBOX"', { envs: { FOO: "bar" } });
    expect(withEnv.stdout).toBe("bar/true\n");
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell parameter expansion
    const later = await sandbox.commands.run('echo "${FOO-unset}"');
    expect(later.stdout).toBe("unset\n");
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell parameter expansion
    const sudo = await sandbox.commands.run("sudo -n bash -c 'echo \"${FOO-unset}\"'");
    expect(sudo.stdout).toBe("unset\n");
    const envd = await sandbox.commands.run(`echo "\${${ENVD_ONLY_VAR}-unset}:\${ENVD_ACCESS_TOKEN-unset}"`);
    expect(envd.stdout).toBe("unset:unset\n");
    const identity = await sandbox.commands.run('echo "$HOME $USER $LOGNAME"');
    expect(identity.stdout).toBe("/home/user user user\n");
  });

  it("runs in the requested cwd, resolves a relative one from the home, and rejects a missing one", async () => {
    expect((await sandbox.commands.run("pwd", { cwd: "/tmp" })).stdout).toBe("/tmp\n");
    expect((await sandbox.commands.run("pwd")).stdout).toBe("/home/user\n");
    expect((await sandbox.commands.run("pwd", { cwd: "~" })).stdout).toBe("/home/user\n");
    const missing = await sandbox.commands.run("pwd", { cwd: "/no/such/dir" }).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(InvalidArgumentError);
    expect((missing as Error).message).toContain("cwd '/no/such/dir' does not exist");
  });

  it("runs as the requested user with that user's supplementary groups, and sudo works for user", async () => {
    expect((await sandbox.commands.run("id -un", { user: "root" })).stdout).toBe("root\n");
    expect((await sandbox.commands.run("id -un", { user: "user" })).stdout).toBe("user\n");
    expect((await sandbox.commands.run("id -un")).stdout).toBe("user\n");
    const groups = (await sandbox.commands.run("id -Gn", { user: "user" })).stdout.trim().split(" ");
    expect(groups).toContain("user");
    expect(groups).toContain(GROUP);
    expect((await sandbox.commands.run("sudo -n id -un", { user: "user" })).stdout).toBe("root\n");
  });

  it("feeds stdin with sendStdin (strings and bytes) and ends cat with closeStdin", async () => {
    const handle = await sandbox.commands.run("cat", { background: true, stdin: true });
    await sandbox.commands.sendStdin(handle.pid, "hello ");
    await handle.sendStdin(new TextEncoder().encode("wörld\n"));
    await sandbox.commands.sendStdin(handle.pid, "");
    await sandbox.commands.sendStdin(handle.pid, "line 2\n$HOME 'q' \"d\"\n");
    await handle.closeStdin();
    const result = await handle.wait();
    expect(result.stdout).toBe("hello wörld\nline 2\n$HOME 'q' \"d\"\n");
  });

  it("kills a command when its timeoutMs elapses: TimeoutError, and the pid is gone", async () => {
    expect((await sandbox.commands.run("sleep 0.1; echo ok", { timeoutMs: 4000 })).stdout).toBe("ok\n");
    await expect(sandbox.commands.run("sleep 10", { timeoutMs: 1000 })).rejects.toBeInstanceOf(TimeoutError);

    // 3 s, so that the check that it runs is not late on a loaded machine.
    const handle = await sandbox.commands.run("sleep 10", { background: true, timeoutMs: 3000 });
    expect(await pidAlive(handle.pid)).toBe(true);
    await expect(handle.wait()).rejects.toBeInstanceOf(TimeoutError);
    expect(await pidAlive(handle.pid)).toBe(false);
  });

  it("reports real OS pids that other commands can signal", async () => {
    const handle = await sandbox.commands.run("sleep 30", { background: true, timeoutMs: 0 });
    expect((await sandbox.commands.run(`kill -0 ${handle.pid} && echo alive`)).stdout).toBe("alive\n");
    expect(await sandbox.commands.kill(handle.pid)).toBe(true);
  });
});

describe("commands.connect, list and kill", () => {
  it("reconnects to a background command after a disconnect and receives its later output", async () => {
    const handle = await sandbox.commands.run('read x; echo "got $x"', { background: true, stdin: true, timeoutMs: 0 });
    await handle.disconnect();
    let seen = "";
    const reconnected = await sandbox.commands.connect(handle.pid, {
      onStdout: (data) => {
        seen += data;
      },
    });
    expect(reconnected.pid).toBe(handle.pid);
    await sandbox.commands.sendStdin(handle.pid, "ping\n");
    const result = await reconnected.wait();
    expect(result.stdout).toBe("got ping\n");
    expect(seen).toBe("got ping\n");
  });

  it("refuses to connect to a pid that does not exist", async () => {
    await expect(sandbox.commands.connect(999_999)).rejects.toBeInstanceOf(NotFoundError);
  });

  it("lists running commands with pid, cmd and args, and not after they are killed", async () => {
    const first = await sandbox.commands.run("sleep 30", { background: true, timeoutMs: 0 });
    const second = await sandbox.commands.run("sleep 31", { background: true, timeoutMs: 0, cwd: "/tmp" });
    const listed = await sandbox.commands.list();
    expect(listed).toContainEqual(
      expect.objectContaining({ pid: first.pid, cmd: "/bin/bash", args: ["-l", "-c", "sleep 30"] }),
    );
    expect(listed).toContainEqual(expect.objectContaining({ pid: second.pid, cwd: "/tmp" }));
    await sandbox.commands.kill(first.pid);
    await sandbox.commands.kill(second.pid);
    await first.wait().catch(() => undefined);
    await second.wait().catch(() => undefined);
    const after = (await sandbox.commands.list()).map((p) => p.pid);
    expect(after).not.toContain(first.pid);
    expect(after).not.toContain(second.pid);
  });

  it("kills a command: kill returns true, the command ends with signal: killed and the pid is gone", async () => {
    const handle = await sandbox.commands.run("sleep 30", { background: true, timeoutMs: 0 });
    expect(await sandbox.commands.kill(handle.pid)).toBe(true);
    const error = await handle.wait().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect(error).toMatchObject({ exitCode: -1, error: "signal: killed" });
    expect(await pidAlive(handle.pid)).toBe(false);
    expect(await sandbox.commands.kill(999_999)).toBe(false);
  });
});

describe("pty", () => {
  const decoder = () => {
    const text = new TextDecoder();
    let output = "";
    return {
      onData: (data: Uint8Array) => {
        output += text.decode(data, { stream: true });
      },
      output: () => output,
    };
  };
  const input = (text: string) => new TextEncoder().encode(text);

  it("creates an interactive shell that sees its envs and exits 0 on `exit`", async () => {
    const out = decoder();
    const terminal = await sandbox.pty.create({
      cols: 80,
      rows: 24,
      envs: { ABC: "123" },
      onData: out.onData,
      timeoutMs: 0,
    });
    await sandbox.pty.sendInput(terminal.pid, input("echo ABC=$ABC\n"));
    await waitUntil(() => out.output().includes("ABC=123"), "the echoed env var");
    await sandbox.pty.sendInput(terminal.pid, input("exit\n"));
    const result = await terminal.wait();
    expect(result.exitCode).toBe(0);
  });

  it("resizes the terminal: tput cols reports the new width", async () => {
    const out = decoder();
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: out.onData, timeoutMs: 0 });
    await sandbox.pty.sendInput(terminal.pid, input("echo COLS=$(tput cols)\n"));
    await waitUntil(() => out.output().includes("COLS=80"), "80 columns");
    await sandbox.pty.resize(terminal.pid, { cols: 100, rows: 24 });
    await sandbox.pty.sendInput(terminal.pid, input("echo COLS=$(tput cols)\n"));
    await waitUntil(() => out.output().includes("COLS=100"), "100 columns");
    expect(await sandbox.pty.kill(terminal.pid)).toBe(true);
  });

  it("reconnects to a pty after a disconnect and receives new output under the same pid", async () => {
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: () => undefined, timeoutMs: 0 });
    await terminal.disconnect();
    const out = decoder();
    const again = await sandbox.pty.connect(terminal.pid, { onData: out.onData });
    expect(again.pid).toBe(terminal.pid);
    await sandbox.pty.sendInput(terminal.pid, input("echo again-$((20+22))\n"));
    await waitUntil(() => out.output().includes("again-42"), "output after reconnecting");
    expect(await sandbox.pty.kill(terminal.pid)).toBe(true);
  });

  it("kills a pty: kill returns true, the pid is gone, and an unknown pid returns false", async () => {
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: () => undefined, timeoutMs: 0 });
    expect(await pidAlive(terminal.pid)).toBe(true);
    expect(await sandbox.pty.kill(terminal.pid)).toBe(true);
    await terminal.wait().catch(() => undefined);
    expect(await pidAlive(terminal.pid)).toBe(false);
    expect((await sandbox.commands.list()).map((p) => p.pid)).not.toContain(terminal.pid);
    expect(await sandbox.pty.kill(999_999)).toBe(false);
  });
});
