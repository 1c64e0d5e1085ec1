import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox, TimeoutError } from "@e2b/code-interpreter";
import { LocalCluster } from "@warren/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkpointTier } from "../src/host-capabilities.js";

const CHECKPOINT_AFTER_MS = 500;

// `runCode` through the whole cluster: the official @e2b/code-interpreter SDK → proxy (E2B_SANDBOX_URL header
// routing) → the code gateway that code-interpreter-v1 sandboxes start next to envd (port 49999).
const TEMPLATES = "base,code-interpreter-v1";
const dataDir = mkdtempSync(join(tmpdir(), "warren-code-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "g",
  nodeCidr: () => "10.215.0.0/22",
  readyTemplates: TEMPLATES.split(","),
  env: {
    WARREN_PREBUILD_TEMPLATES: TEMPLATES,
    WARREN_POOL_TEMPLATES: TEMPLATES,
    // Paused longer than this, a sandbox that can be checkpointed goes from the freezer to CRIU.
    WARREN_CHECKPOINT_AFTER_MS: String(CHECKPOINT_AFTER_MS),
  },
});

let proxyUrl = "";

beforeAll(async () => {
  const env = await cluster.start();
  proxyUrl = env.E2B_SANDBOX_URL;
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 900_000);

/** The node agent's on-disk record of the sandbox's instance (the driver's state). */
function instanceOf(sandboxId: string): { instanceId: string; labels: Record<string, string>; checkpoint?: unknown } {
  const dir = join(dataDir, "agent-ga", "instances");
  for (const name of readdirSync(dir)) {
    const file = join(dir, name, "instance.json");
    if (!existsSync(file)) continue;
    const record = JSON.parse(readFileSync(file, "utf8")) as {
      instanceId: string;
      labels: Record<string, string>;
      checkpoint?: unknown;
    };
    if (record.labels.sandboxId === sandboxId) return record;
  }
  throw new Error(`no instance for ${sandboxId}`);
}

async function eventually<T>(probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 200));
  }
}

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("the official @e2b/code-interpreter SDK against a whole Warren cluster", () => {
  it("Sandbox.create() uses code-interpreter-v1, whose sandboxes answer runCode('x=1; x') with 1", async () => {
    expect((Sandbox as unknown as { defaultTemplate: string }).defaultTemplate).toBe("code-interpreter-v1");
    const sandbox = await Sandbox.create();
    try {
      const execution = await sandbox.runCode("x=1; x");
      expect(execution.error).toBeUndefined();
      expect(execution.text).toBe("1");
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("kernel state persists across calls and after Sandbox.connect; cwd is /home/user; create's envs are visible", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1", { envs: { WARREN_CODE_E2E: "from-create" } });
    try {
      expect((await sandbox.runCode("counter = 41")).error).toBeUndefined();
      expect((await sandbox.runCode("counter += 1; counter")).text).toBe("42");
      const again = await Sandbox.connect(sandbox.sandboxId);
      expect((await again.runCode("counter")).text).toBe("42");
      expect((await again.runCode("import os; os.getcwd()")).text).toBe("/home/user");
      expect((await again.runCode("os.environ['WARREN_CODE_E2E']")).text).toBe("from-create");
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("the gateway runs in its own session under tini (no parent but PID 1's), apart from envd's session", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      // Both default kernels have run a cell, so they exist.
      expect((await sandbox.runCode("1")).text).toBe("1");
      expect((await sandbox.runCode("1", { language: "js" })).text).toBe("1");
      const ps = await sandbox.commands.run("ps -eo pid=,ppid=,sid=,args=");
      const rows = ps.stdout
        .trim()
        .split("\n")
        .map((line) => {
          const [pid, ppid, sid, ...args] = line.trim().split(/\s+/);
          return { pid: Number(pid), ppid: Number(ppid), sid: Number(sid), args: args.join(" ") };
        });
      const gateway = rows.find(
        (r) => r.args.includes("/opt/warren/code-gateway/dist/main.js") && r.args.startsWith("/opt/warren/bin/node"),
      );
      const envd = rows.find((r) => r.args.startsWith("/opt/warren/bin/node") && r.args.includes("/opt/warren/envd/"));
      expect(gateway).toBeDefined();
      expect(envd).toBeDefined();
      expect(gateway?.sid).not.toBe(envd?.sid);
      const leader = rows.find((r) => r.pid === gateway?.sid);
      expect(leader?.ppid).toBe(1);
      expect(rows.find((r) => r.pid === 1)?.args).toMatch(/tini/);
      expect(envd?.ppid).toBe(1);
      // Kernels are the gateway's children, each in a session of its own.
      const kernels = rows.filter((r) => r.ppid === gateway?.pid);
      expect(kernels.length).toBeGreaterThanOrEqual(2);
      for (const kernel of kernels) expect(kernel.sid).toBe(kernel.pid);
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("a JavaScript context keeps its own state, separate from Python's", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      const context = await sandbox.createCodeContext({ language: "js" });
      expect(context.language).toBe("javascript");
      expect((await sandbox.runCode("const base = 40", { context })).error).toBeUndefined();
      expect((await sandbox.runCode("base + 2", { context })).text).toBe("42");
      const python = await sandbox.runCode("base");
      expect(python.error?.name).toBe("NameError");
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("R and Java (E2B's env_vars/r, env_vars/java, cwd r/java): results, output, env vars, cwd, errors, in 1 GiB", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1", { envs: { TEST_ENV_VAR: "supertest" } });
    try {
      // R: IRkernel's text, create's envs, per-execution envs for one execution only, cwd, errors.
      const r = await sandbox.runCode('cat("from r\\n"); Sys.getenv("TEST_ENV_VAR")', { language: "r" });
      expect(r.error).toBeUndefined();
      expect(r.logs.stdout).toEqual(["from r\n"]);
      expect(r.results[0]?.text.trim()).toBe('[1] "supertest"');
      const rOwn = await sandbox.runCode('Sys.getenv("TEST_ENV_VAR")', {
        language: "r",
        envs: { TEST_ENV_VAR: "overwrite" },
      });
      expect(rOwn.results[0]?.text.trim()).toBe('[1] "overwrite"');
      expect((await sandbox.runCode('Sys.getenv("TEST_ENV_VAR")', { language: "r" })).results[0]?.text.trim()).toBe(
        '[1] "supertest"',
      );
      const rFoo = await sandbox.runCode('Sys.getenv("FOO")', { language: "r", envs: { FOO: "bar" } });
      expect(rFoo.results[0]?.text.trim()).toBe('[1] "bar"');
      const rUnset = await sandbox.runCode('Sys.getenv("FOO", unset = "default")', { language: "r" });
      expect(rUnset.results[0]?.text.trim()).toBe('[1] "default"');
      expect((await sandbox.runCode("getwd()", { language: "r" })).results[0]?.text.trim()).toBe('[1] "/home/user"');
      expect((await sandbox.runCode('stop("boom")', { language: "r" })).error?.value).toContain("boom");

      // Java: values as toString(), properties and env, cwd (user.dir), a context's own cwd and state, errors.
      const java = await sandbox.runCode('System.out.println("from java"); System.getProperty("TEST_ENV_VAR")', {
        language: "java",
      });
      expect(java.error).toBeUndefined();
      expect(java.logs.stdout).toEqual(["from java\n"]);
      expect(java.results[0]?.text.trim()).toBe("supertest");
      const javaOwn = await sandbox.runCode('System.getProperty("FOO") + " " + System.getenv("FOO")', {
        language: "java",
        envs: { FOO: "bar" },
      });
      expect(javaOwn.results[0]?.text.trim()).toBe("bar bar");
      const javaUnset = await sandbox.runCode('System.getProperty("FOO", "default")', { language: "java" });
      expect(javaUnset.results[0]?.text.trim()).toBe("default");
      const javaCwd = await sandbox.runCode('System.getProperty("user.dir")', { language: "java" });
      expect(javaCwd.results[0]?.text.trim()).toBe("/home/user");
      const context = await sandbox.createCodeContext({ language: "java", cwd: "/tmp" });
      expect((await sandbox.runCode("int n = 41;", { context })).error).toBeUndefined();
      expect((await sandbox.runCode('n + 1 + " in " + System.getProperty("user.dir")', { context })).text).toBe(
        "42 in /tmp",
      );
      const thrown = await sandbox.runCode('throw new IllegalStateException("boom")', { context });
      expect(thrown.error).toMatchObject({ name: "EvalException", value: "boom" });

      // Python, JavaScript, R and two JVMs share the sandbox's 1024 MiB: all still answer.
      expect((await sandbox.runCode("1 + 1")).text).toBe("2");
      expect((await sandbox.runCode("1 + 1", { language: "js" })).text).toBe("2");
      expect((await sandbox.runCode("1 + 1", { language: "r" })).results[0]?.text).toBe("[1] 2");
      expect((await sandbox.runCode("n", { context })).text).toBe("41");
    } finally {
      await sandbox.kill();
    }
  }, 300_000);

  it("an unsupported language is a 400 with E2B's gateway's body, through the proxy", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      const token = (sandbox as unknown as { envdAccessToken?: string }).envdAccessToken ?? "";
      const res = await fetch(`${proxyUrl}/execute`, {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          "E2b-Sandbox-Id": sandbox.sandboxId,
          "E2b-Sandbox-Port": "49999",
          "X-Access-Token": token,
        },
        body: JSON.stringify({ code: "1", language: "cobol" }),
      });
      expect(res.status).toBe(400);
      expect(await res.text()).toBe(
        'Failed to create context: {"message": "The \'cobol\' kernel is not available. Please pick another ' +
          'suitable kernel instead, or install that kernel.", "short_message": "cobol not found"}',
      );
      // The SDK reports the status only (as against E2B).
      await expect(sandbox.runCode("1", { language: "cobol" as never })).rejects.toThrow(/400/);
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("a matplotlib figure arrives as a PNG result", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      const execution = await sandbox.runCode(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
      );
      expect(execution.error).toBeUndefined();
      const png = execution.results.find((r) => r.png)?.png;
      expect(png).toBeTruthy();
      expect(Buffer.from(png ?? "", "base64").subarray(0, 8)).toEqual(
        Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
      );
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("port 49999 through the proxy enforces the sandbox's access token: none or a wrong one is 401", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      const execute = (token?: string) =>
        fetch(`${proxyUrl}/execute`, {
          method: "POST",
          headers: {
            "Content-Type": "application/json",
            "E2b-Sandbox-Id": sandbox.sandboxId,
            "E2b-Sandbox-Port": "49999",
            ...(token === undefined ? {} : { "X-Access-Token": token }),
          },
          body: JSON.stringify({ code: "1" }),
        });
      const token = (sandbox as unknown as { envdAccessToken?: string }).envdAccessToken;
      expect(token).toBeTruthy();
      expect((await execute()).status).toBe(401);
      expect((await execute(`${token}x`)).status).toBe(401);
      const allowed = await execute(token);
      expect(allowed.status).toBe(200);
      expect(await allowed.text()).toContain('"end_of_execution"');
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("a fork bomb in a cell stops short of the pids limit: commands still start, and restarting the context ends it", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      const { instanceId } = instanceOf(sandbox.sandboxId);
      const pidsFile = (file: string) =>
        Number(readFileSync(join("/sys/fs/cgroup/pids/warren/ga", instanceId, file), "utf8").trim());
      const pidsMax = pidsFile("pids.max");
      const context = await sandbox.createCodeContext({ language: "python" });
      // Each child holds its pid (a small `sleep`, so memory is not what ends the bomb; posix_spawn does not copy
      // the kernel's page tables, so the bomb is quick); the cell stops at its first failure and says how many.
      const bomb = await sandbox.runCode(
        "import os\nkids = 0\nwhile True:\n    try:\n        os.posix_spawn('/bin/sleep', ['sleep', '600'], {})\n    except OSError:\n        break\n    kids += 1\nkids",
        { context, timeoutMs: 120_000 },
      );
      expect(bomb.error).toBeUndefined();
      const kids = Number(bomb.text);
      // The kernel's uid (sandbox root, envd's too) is at its process limit, an eighth of the pids limit short.
      expect(kids).toBeGreaterThan(pidsMax / 2);
      expect(pidsFile("pids.current")).toBeLessThan(pidsMax);
      // The kernel and what it forked run in the workload cgroup, out of envd's and the gateway's memory reserve.
      const workload = readFileSync(
        join("/sys/fs/cgroup/memory/warren/ga", instanceId, "workload/cgroup.procs"),
        "utf8",
      );
      expect(workload.split("\n").filter(Boolean).length).toBeGreaterThan(kids);
      // envd still starts a command (as `user`, whose count is low) and it can fork.
      expect((await sandbox.commands.run("echo ok | cat")).stdout).toBe("ok\n");
      // A restart kills the kernel's process group, the bomb with it.
      await sandbox.restartCodeContext(context);
      await eventually(async () => (pidsFile("pids.current") < 64 ? true : undefined), 60_000);
      expect((await sandbox.runCode("1 + 1", { context })).text).toBe("2");
    } finally {
      await sandbox.kill();
    }
  }, 300_000);

  it("a kill during an execution ends runCode with the SDK's 'sandbox was killed' TimeoutError", async () => {
    const sandbox = await Sandbox.create("code-interpreter-v1");
    let killed: Promise<unknown> | undefined;
    const running = sandbox.runCode("import time\nprint('started', flush=True)\ntime.sleep(300)", {
      onStdout: () => {
        killed ??= Sandbox.kill(sandbox.sandboxId);
      },
    });
    const error = await running.then(
      () => undefined,
      (e: unknown) => e,
    );
    await killed;
    expect(error).toBeInstanceOf(TimeoutError);
    expect((error as Error).message).toMatch(/sandbox was killed/);
  }, 120_000);

  it("a paused code sandbox is checkpointed with CRIU (gateway, kernels and their ZeroMQ sockets) where CRIU works, else stays frozen; it resumes with its kernels' state", async () => {
    const deep = checkpointTier();
    const sandbox = await Sandbox.create("code-interpreter-v1");
    try {
      const js = await sandbox.createCodeContext({ language: "js" });
      expect((await sandbox.runCode("kept = 'before pause'")).error).toBeUndefined();
      expect((await sandbox.runCode("globalThis.keptJs = 7", { context: js })).error).toBeUndefined();
      expect(await sandbox.pause()).toBe(true);
      if (deep.usable) await eventually(async () => (instanceOf(sandbox.sandboxId).checkpoint ? true : undefined));
      else {
        // No working CRIU on this host (the agent's probe says why): past the delay it is still frozen in memory.
        await new Promise((r) => setTimeout(r, CHECKPOINT_AFTER_MS + 1000));
        expect(instanceOf(sandbox.sandboxId).checkpoint).toBeUndefined();
      }
      await sandbox.connect();
      expect(instanceOf(sandbox.sandboxId).checkpoint).toBeUndefined();
      expect((await sandbox.runCode("kept")).text).toBe("before pause");
      expect((await sandbox.runCode("keptJs * 6", { context: js })).text).toBe("42");
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it("fork copies a code sandbox: with its kernels' variables where CRIU works, else its files (fresh kernels)", async () => {
    const deep = checkpointTier();
    const source = await Sandbox.create("code-interpreter-v1");
    const forks: Sandbox[] = [];
    try {
      expect((await source.runCode("shared = 41")).error).toBeUndefined();
      await source.files.write("/home/user/data.txt", "from the source");
      for (const fork of await source.fork({ count: 2, timeoutMs: 120_000 })) {
        if (!(fork instanceof Sandbox)) throw fork;
        forks.push(fork);
      }
      const [a, b] = forks;
      if (!a || !b) throw new Error("no forks");
      for (const fork of forks) expect(await fork.files.read("/home/user/data.txt")).toBe("from the source");
      if (deep.usable) {
        // The kernels went along: each fork goes on from the source's state, independently.
        expect((await a.runCode("shared + 1")).text).toBe("42");
        expect((await a.runCode("shared = 100; shared")).text).toBe("100");
        expect((await b.runCode("shared")).text).toBe("41");
      } else {
        expect((await a.runCode("shared")).error?.name).toBe("NameError");
      }
      expect((await source.runCode("shared")).text).toBe("41");
    } finally {
      await Promise.all([source, ...forks].map((s) => s.kill().catch(() => false)));
    }
  }, 180_000);
});
