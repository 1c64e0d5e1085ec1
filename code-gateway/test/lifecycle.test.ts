import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, expect, it } from "vitest";
import {
  eventually,
  processesMentioning,
  sdkSandbox,
  startTestEnvd,
  startTestGateway,
  type TestGateway,
  type TestProcess,
} from "./harness.js";

const started: TestProcess[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((p) => p.stop("SIGTERM")));
});

async function gatewayFor(options: Parameters<typeof startTestGateway>[0] = {}): Promise<TestGateway> {
  const gateway = await startTestGateway(options);
  started.push(gateway);
  return gateway;
}

function descendants(pid: number): number[] {
  const result: number[] = [];
  const visit = (p: number) => {
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${p}/task`);
    } catch {
      return;
    }
    for (const task of tasks) {
      let children = "";
      try {
        children = readFileSync(`/proc/${p}/task/${task}/children`, "utf8");
      } catch {
        continue;
      }
      for (const child of children.split(" ").filter(Boolean).map(Number)) {
        result.push(child);
        visit(child);
      }
    }
  };
  visit(pid);
  return result;
}

function alive(pids: number[]): number[] {
  return pids.filter((pid) => {
    try {
      const state = /^State:\s+(\S)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
      return state !== "Z";
    } catch {
      return false;
    }
  });
}

it("checks X-Access-Token on /execute as envd does, and never logs the token", async () => {
  const token = "gateway-secret-token-4f1c";
  const gateway = await gatewayFor({ accessToken: token });
  const anonymous = await fetch(`${gateway.url}/execute`, { method: "POST", body: JSON.stringify({ code: "1" }) });
  expect(anonymous.status).toBe(401);
  expect(await anonymous.json()).toEqual({
    code: 401,
    message: "unauthorized access, please provide a valid access token or method signing if supported",
  });
  await expect(sdkSandbox(gateway, { accessToken: "wrong" }).runCode("1")).rejects.toThrow(/401/);
  const execution = await sdkSandbox(gateway, { accessToken: token }).runCode("'ok'");
  expect(execution.text).toBe("ok");
  // The token must not reach kernels either.
  const env = await sdkSandbox(gateway, { accessToken: token }).runCode(
    "import os; [k for k, v in os.environ.items() if 'gateway-secret' in v]",
  );
  expect(env.text).toBe("[]");
  expect(gateway.logs()).not.toContain(token);
});

it("with CODE_GATEWAY_AUTH=envd, /execute accepts exactly envd's current token, even one /init set after start", async () => {
  const envd = await startTestEnvd();
  started.push(envd);
  const gateway = await gatewayFor({ envdUrl: envd.url, env: { CODE_GATEWAY_AUTH: "envd" } });
  // envd has no token yet (a warm-pool sandbox before /init): nothing to check.
  expect((await sdkSandbox(gateway).runCode("'open'")).text).toBe("open");

  const token = "token-set-by-init-after-gateway-start";
  const init = await fetch(`${envd.url}/init`, { method: "POST", body: JSON.stringify({ accessToken: token }) });
  expect(init.status).toBe(204);
  await new Promise((resolve) => setTimeout(resolve, 2_100)); // past the cached "no token" verdict
  const anonymous = await fetch(`${gateway.url}/execute`, { method: "POST", body: JSON.stringify({ code: "1" }) });
  expect(anonymous.status).toBe(401);
  await expect(sdkSandbox(gateway, { accessToken: "wrong" }).runCode("1")).rejects.toThrow(/401/);
  expect((await sdkSandbox(gateway, { accessToken: token }).runCode("'secured'")).text).toBe("secured");
  expect(gateway.logs()).not.toContain(token);
});

it("makes envd's sandbox-global env vars visible in every language; per-execution vars override, then restore", async () => {
  const token = "envd-token-9a8b7c";
  const envd = await startTestEnvd(token);
  started.push(envd);
  const init = await fetch(`${envd.url}/init`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Access-Token": token },
    body: JSON.stringify({ envVars: { WARREN_GLOBAL: "from-init", WARREN_OVERRIDE: "global" } }),
  });
  expect(init.status).toBe(204);
  const gateway = await gatewayFor({ accessToken: token, envdUrl: envd.url });
  const sandbox = sdkSandbox(gateway, { accessToken: token });

  expect((await sandbox.runCode("import os; os.environ['WARREN_GLOBAL']")).text).toBe("from-init");
  expect((await sandbox.runCode("process.env.WARREN_GLOBAL", { language: "js" })).text).toBe("from-init");
  expect((await sandbox.runCode("process.env.WARREN_GLOBAL", { language: "ts" })).text).toBe("from-init");
  const bash = await sandbox.runCode("echo $WARREN_GLOBAL", { language: "bash" });
  expect(bash.logs.stdout.join("")).toBe("from-init\n");

  const overridden = await sandbox.runCode("import os; os.environ['WARREN_OVERRIDE']", {
    envs: { WARREN_OVERRIDE: "local" },
  });
  expect(overridden.text).toBe("local");
  expect((await sandbox.runCode("import os; os.environ['WARREN_OVERRIDE']")).text).toBe("global");
  const bashOverride = await sandbox.runCode("echo $WARREN_OVERRIDE", {
    language: "bash",
    envs: { WARREN_OVERRIDE: "local" },
  });
  expect(bashOverride.logs.stdout.join("")).toBe("local\n");
  const bashRestored = await sandbox.runCode("echo $WARREN_OVERRIDE", { language: "bash" });
  expect(bashRestored.logs.stdout.join("")).toBe("global\n");
});

it("says in its logs that envd is unreachable and runs code anyway", async () => {
  const gateway = await gatewayFor();
  const execution = await sdkSandbox(gateway).runCode("'still works'");
  expect(execution.text).toBe("still works");
  expect(gateway.logs()).toContain("envd is not reachable");
});

it("interrupts an execution that outlives CODE_GATEWAY_EXECUTION_TIMEOUT_MS and ends the stream", async () => {
  const gateway = await gatewayFor({ env: { CODE_GATEWAY_EXECUTION_TIMEOUT_MS: "1500" } });
  const sandbox = sdkSandbox(gateway);
  const started = performance.now();
  const execution = await sandbox.runCode("import time; time.sleep(300)");
  expect(execution.error?.name).toBe("ExecutionTimeout");
  expect(performance.now() - started).toBeLessThan(10_000);
  expect((await sandbox.runCode("1 + 1")).text).toBe("2");
});

it("SIGTERM shuts every kernel down and leaves no process or runtime file behind", async () => {
  const gateway = await gatewayFor();
  const sandbox = sdkSandbox(gateway);
  await sandbox.runCode("echo hi", { language: "bash" });
  await sandbox.runCode("1", { language: "ts" });
  await sandbox.createCodeContext();
  const tree = descendants(gateway.child.pid!);
  expect(processesMentioning(gateway.runtimeDir).length).toBeGreaterThanOrEqual(5);
  await gateway.stop("SIGTERM");
  expect(gateway.child.exitCode).toBe(0);
  expect(alive(tree)).toEqual([]);
  expect(processesMentioning(gateway.runtimeDir)).toEqual([]);
  expect(existsSync(gateway.runtimeDir)).toBe(false);
  expect(gateway.logs()).toContain('"msg":"stopping"');
});

it("a gateway killed with SIGKILL takes its kernels (and bash's shell) with it; the next gateway removes its files", async () => {
  const gateway = await gatewayFor({ defaultRuntimeDir: true });
  await sdkSandbox(gateway).runCode("echo hi", { language: "bash" });
  const tree = descendants(gateway.child.pid!);
  expect(tree.length).toBeGreaterThanOrEqual(4);
  await gateway.stop("SIGKILL");
  const left = await eventually(
    () => alive(tree),
    (pids) => pids.length === 0,
    5000,
  );
  expect(left).toEqual([]);
  expect(existsSync(gateway.runtimeDir)).toBe(true);
  const next = await gatewayFor({ defaultRuntimeDir: true });
  expect(existsSync(gateway.runtimeDir)).toBe(false);
  expect(next.logs()).toContain("removed a dead gateway's runtime directory");
});

it("a kernel that cannot start gives a clear 500, and the gateway keeps serving the other languages", async () => {
  const gateway = await gatewayFor({ env: { CODE_GATEWAY_PYTHON: "/nonexistent/python3" } });
  expect(gateway.logs()).toContain("default context failed to start");
  const res = await fetch(`${gateway.url}/execute`, { method: "POST", body: JSON.stringify({ code: "1" }) });
  expect(res.status).toBe(500);
  expect(await res.text()).toMatch(/failed to start a python kernel: kernel failed to start \(exit code \d+\)/);
  const js = await sdkSandbox(gateway).runCode("6 * 7", { language: "js" });
  expect(js.text).toBe("42");
});

/** An executable standing in for python3: `body` runs first (as Python), then, unless it exits, the real one. */
function pythonWrapper(body: string): { path: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), "wcg-python-"));
  const path = join(dir, "python3");
  writeFileSync(
    path,
    `#!/usr/bin/python3\nimport os, sys, time\n${body}\nos.execv("/usr/bin/python3", ["python3", *sys.argv[1:]])\n`,
  );
  chmodSync(path, 0o755);
  return { path, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

it("a kernel start that outlasts the timeout while it uses CPU (a busy node) goes on and the kernel runs code", async () => {
  // Three seconds of work before the kernel's own start, against a 100 ms timeout: a busy node's slow import.
  const slow = pythonWrapper("end = time.monotonic() + 3\nwhile time.monotonic() < end: pass");
  try {
    const gateway = await gatewayFor({
      env: { CODE_GATEWAY_PYTHON: slow.path, CODE_GATEWAY_KERNEL_START_TIMEOUT_MS: "100" },
    });
    expect(gateway.logs()).not.toContain("default context failed to start");
    expect(gateway.logs()).toContain("kernel still starting on a busy node: waiting longer");
    expect((await sdkSandbox(gateway).runCode("6 * 7")).text).toBe("42");
  } finally {
    slow.remove();
  }
});

it("a kernel start that stops using CPU fails soon after the timeout, with a 500 that says so", async () => {
  const stuck = pythonWrapper("time.sleep(600)");
  try {
    const gateway = await gatewayFor({
      env: {
        CODE_GATEWAY_PYTHON: stuck.path,
        CODE_GATEWAY_KERNEL_START_TIMEOUT_MS: "100",
        CODE_GATEWAY_START_LANGUAGES: "",
      },
    });
    expect(gateway.logs()).toContain("default context failed to start");
    const res = await fetch(`${gateway.url}/execute`, { method: "POST", body: JSON.stringify({ code: "1" }) });
    expect(res.status).toBe(500);
    expect(await res.text()).toMatch(
      /failed to start a python kernel: kernel did not answer within \d+ ms \(timeout 100 ms; its process used no CPU in the last \d+ ms\)/,
    );
    // The stuck process went with its start.
    expect(
      await eventually(
        () => processesMentioning(stuck.path),
        (pids) => pids.length === 0,
      ),
    ).toEqual([]);
  } finally {
    stuck.remove();
  }
});
