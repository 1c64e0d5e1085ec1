/**
 * One scenario file, two clients: every scenario here runs once with Warren's SDK and once with
 * the official `e2b` / `@e2b/code-interpreter` SDKs against the same envd and code gateway, and
 * the results must be equal. Scenarios use only the surface both SDKs share, so this file is also
 * the list of what "E2B-compatible" means for Warren's SDK.
 */

/** The part of a Sandbox both SDKs have (structurally typed: either SDK's instance fits). */
export interface CommonSandbox {
  commands: {
    run(cmd: string, opts?: Record<string, unknown>): Promise<unknown>;
    connect(pid: number, opts?: Record<string, unknown>): Promise<CommonHandle>;
    kill(pid: number): Promise<boolean>;
    sendStdin(pid: number, data: string): Promise<void>;
    list(): Promise<Array<{ pid: number; cmd: string; args: string[] }>>;
  };
  files: {
    write(path: string, data: string, opts?: Record<string, unknown>): Promise<unknown>;
    read(path: string, opts?: Record<string, unknown>): Promise<unknown>;
    list(path: string, opts?: Record<string, unknown>): Promise<unknown[]>;
    exists(path: string): Promise<boolean>;
    makeDir(path: string): Promise<boolean>;
    rename(from: string, to: string): Promise<unknown>;
    remove(path: string): Promise<void>;
    getInfo(path: string): Promise<unknown>;
    watchDir(
      path: string,
      onEvent: (e: { name: string; type: string }) => void,
      opts?: Record<string, unknown>,
    ): Promise<{ stop(): Promise<void> }>;
  };
  pty: {
    create(opts: {
      cols: number;
      rows: number;
      onData: (d: Uint8Array) => void;
      timeoutMs?: number;
    }): Promise<CommonHandle>;
    sendInput(pid: number, data: Uint8Array): Promise<void>;
    kill(pid: number): Promise<boolean>;
  };
}

export interface CommonHandle {
  pid: number;
  wait(): Promise<unknown>;
  kill(): Promise<boolean>;
  sendStdin(data: string): Promise<void>;
  closeStdin(): Promise<void>;
  disconnect(): Promise<void>;
}

export interface CommonCodeSandbox {
  runCode(
    code: string,
    opts?: Record<string, unknown>,
  ): Promise<{
    text?: string;
    logs: { stdout: string[]; stderr: string[] };
    error?: { name: string; value: string };
    results: Array<{ isMainResult: boolean; text?: string }>;
  }>;
  createCodeContext(opts?: Record<string, unknown>): Promise<{ id: string; language: string; cwd: string }>;
  removeCodeContext(context: { id: string } | string): Promise<void>;
}

export interface ScenarioContext {
  /** A directory name unique to this run (results replace it with `<dir>`). */
  dir: string;
  until(check: () => boolean | Promise<boolean>, what: string): Promise<void>;
}

/** What an error looks like to a caller: its class name, and the result fields E2B errors carry. */
export function errorShape(error: unknown): Record<string, unknown> {
  if (!(error instanceof Error)) return { thrown: String(error) };
  const shape: Record<string, unknown> = { name: error.name };
  for (const key of ["exitCode", "stdout", "stderr", "error"]) {
    const value = (error as unknown as Record<string, unknown>)[key];
    if (value !== undefined) shape[key] = value;
  }
  return shape;
}

async function outcome(run: () => Promise<unknown>): Promise<unknown> {
  try {
    return { ok: await run() };
  } catch (error) {
    return { error: errorShape(error) };
  }
}

function pick(value: unknown, keys: string[]): Record<string, unknown> {
  const source = value as Record<string, unknown>;
  return Object.fromEntries(keys.filter((k) => source[k] !== undefined).map((k) => [k, source[k]]));
}

const encode = (s: string) => new TextEncoder().encode(s);

export const commandScenarios: Record<string, (s: CommonSandbox, ctx: ScenarioContext) => Promise<unknown>> = {
  "run echo": (s) => s.commands.run("echo hello; echo oops >&2"),
  "run with special characters and multiline output": (s) => s.commands.run("printf 'a\\tb\\n$HOME\\n\"q\"\\n'"),
  "non-zero exit": (s) => outcome(() => s.commands.run("echo before; exit 4")),
  "streaming callbacks": async (s) => {
    const out: string[] = [];
    const err: string[] = [];
    await s.commands.run("echo 1; echo 2 >&2; echo 3", {
      onStdout: (d: string) => void out.push(d),
      onStderr: (d: string) => void err.push(d),
      timeoutMs: 30_000,
    });
    return { stdout: out.join(""), stderr: err.join("") };
  },
  "user, cwd and envs": (s) =>
    s.commands.run('echo "$(whoami):$(pwd):$X"', { user: "root", cwd: "/tmp", envs: { X: "y" } }),
  "missing cwd": (s) => outcome(() => s.commands.run("pwd", { cwd: "/no/such/dir" })),
  "background stdin and closeStdin": async (s) => {
    const handle = (await s.commands.run("cat", { background: true, stdin: true })) as CommonHandle;
    await handle.sendStdin("in-");
    await s.commands.sendStdin(handle.pid, "put\n");
    await handle.closeStdin();
    return handle.wait();
  },
  "kill a background command": async (s) => {
    const handle = (await s.commands.run("sleep 600", { background: true })) as CommonHandle;
    const listed = (await s.commands.list()).find((p) => p.pid === handle.pid);
    const killed = await handle.kill();
    const waited = await outcome(() => handle.wait());
    return { listed: pick(listed, ["cmd", "args"]), killed, waited, unknown: await s.commands.kill(999_999) };
  },
  "disconnect then connect": async (s) => {
    const handle = (await s.commands.run("read x; echo got-$x", { background: true, stdin: true })) as CommonHandle;
    await handle.disconnect();
    const attached = await s.commands.connect(handle.pid);
    await s.commands.sendStdin(handle.pid, "it\n");
    return attached.wait();
  },
  "connect to an unknown pid": (s) => outcome(() => s.commands.connect(999_999)),
};

export const fileScenarios: Record<string, (s: CommonSandbox, ctx: ScenarioContext) => Promise<unknown>> = {
  "write and read back": async (s, { dir }) => {
    const written = await s.files.write(`${dir}/a.txt`, "content");
    return { written, read: await s.files.read(`${dir}/a.txt`) };
  },
  "directory operations": async (s, { dir }) => {
    const made = [await s.files.makeDir(`${dir}/d/e`), await s.files.makeDir(`${dir}/d/e`)];
    await s.files.write(`${dir}/d/f.txt`, "1234");
    const listed = (await s.files.list(`${dir}/d`, { depth: 2 })).map((e) => pick(e, ["name", "type", "path"]));
    const info = pick(await s.files.getInfo(`${dir}/d/f.txt`), [
      "name",
      "type",
      "path",
      "size",
      "mode",
      "permissions",
      "owner",
      "group",
    ]);
    const renamed = pick(await s.files.rename(`${dir}/d/f.txt`, `${dir}/d/g.txt`), ["name", "type", "path"]);
    const exists = [await s.files.exists(`${dir}/d/f.txt`), await s.files.exists(`${dir}/d/g.txt`)];
    await s.files.remove(`${dir}/d`);
    return { made, listed, info, renamed, exists, gone: await s.files.exists(`${dir}/d`) };
  },
  "missing file errors": async (s, { dir }) => ({
    read: await outcome(() => s.files.read(`${dir}/missing`)),
    info: await outcome(() => s.files.getInfo(`${dir}/missing`)),
    rename: await outcome(() => s.files.rename(`${dir}/missing`, `${dir}/other`)),
    depth: await outcome(() => s.files.list(dir, { depth: 0 })),
  }),
  "watch a directory": async (s, { dir, until }) => {
    await s.files.makeDir(`${dir}/w`);
    const events: Array<{ name: string; type: string }> = [];
    const handle = await s.files.watchDir(`${dir}/w`, (e) => void events.push({ name: e.name, type: e.type }), {
      timeoutMs: 30_000,
    });
    await s.files.write(`${dir}/w/x.txt`, "x");
    await until(() => events.some((e) => e.type === "write"), "a write event");
    await handle.stop();
    return events.find((e) => e.type === "write");
  },
};

export const ptyScenarios: Record<string, (s: CommonSandbox, ctx: ScenarioContext) => Promise<unknown>> = {
  "pty echo and exit": async (s, { until }) => {
    let text = "";
    const decoder = new TextDecoder();
    const terminal = await s.pty.create({
      cols: 80,
      rows: 24,
      onData: (d) => {
        text += decoder.decode(d);
      },
      timeoutMs: 30_000,
    });
    await s.pty.sendInput(terminal.pid, encode("echo pty-$((6*7))\n"));
    await until(() => text.includes("pty-42"), "pty output");
    await s.pty.sendInput(terminal.pid, encode("exit\n"));
    const result = pick(await terminal.wait(), ["exitCode"]);
    return { result, unknownKill: await s.pty.kill(999_999) };
  },
};

export const codeScenarios: Record<string, (s: CommonCodeSandbox) => Promise<unknown>> = {
  "expression result": async (s) => {
    const execution = await s.runCode("x = 1\nx + 1");
    return { text: execution.text, main: execution.results.map((r) => r.isMainResult) };
  },
  "stdout and error": async (s) => {
    const execution = await s.runCode("print('p')\nnot_defined_name");
    // Joined: the kernel sends print's "p" and "\n" as one stream message or two, depending on timing.
    return { stdout: execution.logs.stdout.join(""), error: pick(execution.error, ["name", "value"]) };
  },
  "context state": async (s) => {
    const context = await s.createCodeContext({ language: "python", cwd: "/tmp" });
    await s.runCode("z = 'ctx'", { context });
    const text = (await s.runCode("z", { context })).text;
    await s.removeCodeContext(context);
    return { language: context.language, cwd: context.cwd, text };
  },
  "language and context together": async (s) =>
    outcome(() => s.runCode("1", { language: "python", context: { id: "x", language: "python", cwd: "/" } })),
};
