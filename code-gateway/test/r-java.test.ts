import { mkdtempSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Sandbox, TimeoutError } from "@e2b/code-interpreter";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  processesMentioning,
  sdkSandbox,
  startTestEnvd,
  startTestGateway,
  type TestGateway,
  type TestProcess,
} from "./harness.js";

// R (Debian's IRkernel) and Java (jshell_kernel.py + WarrenJShell.java) through the official SDK: E2B's
// js/tests env_vars/r, env_vars/java and cwd cases, plus results, output, errors and interrupts.
const TOKEN = "r-java-token-5c1d";
let envd: TestProcess;
let gateway: TestGateway;
let sandbox: Sandbox;
let workDir: string;
beforeAll(async () => {
  envd = await startTestEnvd(TOKEN);
  const init = await fetch(`${envd.url}/init`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Access-Token": TOKEN },
    body: JSON.stringify({ envVars: { TEST_ENV_VAR: "supertest" } }),
  });
  expect(init.status).toBe(204);
  workDir = realpathSync(mkdtempSync(join(tmpdir(), "wcg-rj-")));
  gateway = await startTestGateway({
    accessToken: TOKEN,
    envdUrl: envd.url,
    env: { CODE_GATEWAY_START_LANGUAGES: "python", CODE_GATEWAY_DEFAULT_CWD: workDir },
  });
  sandbox = sdkSandbox(gateway, { accessToken: TOKEN });
}, 60_000);
afterAll(async () => {
  await gateway?.stop();
  await envd?.stop();
  rmSync(workDir, { recursive: true, force: true });
  // The JVM and R went with their kernels.
  expect(processesMentioning(gateway.runtimeDir)).toEqual([]);
});

describe("r", () => {
  it("starts lazily: no R kernel until the first R execution", async () => {
    const contexts = await sandbox.listCodeContexts();
    expect(contexts.map((c) => c.language)).toEqual(["python"]);
  });

  it("shows a value as IRkernel prints it, and streams stdout and stderr", async () => {
    const execution = await sandbox.runCode('cat("hello\\n"); message("oops"); c(1, 2, 3) * 2', { language: "r" });
    expect(execution.results[0]?.text).toBe("[1] 2 4 6");
    expect(execution.logs.stdout).toEqual(["hello\n"]);
    expect(execution.logs.stderr.join("")).toContain("oops");
    expect(execution.error).toBeUndefined();
  });

  it("reads sandbox-global env vars, per-execution ones win for one execution only (E2B env_vars/r)", async () => {
    const global = await sandbox.runCode('Sys.getenv("TEST_ENV_VAR")', { language: "r" });
    expect(global.results[0]?.text.trim()).toBe('[1] "supertest"');
    const perExecution = await sandbox.runCode('Sys.getenv("FOO")', { language: "r", envs: { FOO: "bar" } });
    expect(perExecution.results[0]?.text.trim()).toBe('[1] "bar"');
    const after = await sandbox.runCode('Sys.getenv("FOO", unset = "default")', { language: "r" });
    expect(after.results[0]?.text.trim()).toBe('[1] "default"');
    const overwrite = await sandbox.runCode('Sys.getenv("TEST_ENV_VAR")', {
      language: "r",
      envs: { TEST_ENV_VAR: "overwrite" },
    });
    expect(overwrite.results[0]?.text.trim()).toBe('[1] "overwrite"');
    const restored = await sandbox.runCode('Sys.getenv("TEST_ENV_VAR")', { language: "r" });
    expect(restored.results[0]?.text.trim()).toBe('[1] "supertest"');
  });

  it("passes values with quotes, backslashes and newlines through unchanged, also to subprocesses", async () => {
    const value = `a "quoted" \\ back\nslash ' it's`;
    const execution = await sandbox.runCode('cat(system("printf %s \\"$ODD\\"", intern = TRUE), sep = "\\n")', {
      language: "r",
      envs: { ODD: value },
    });
    expect(execution.logs.stdout.join("")).toBe(`${value}\n`);
  });

  it("runs in the default cwd and in a context's own cwd (E2B cwd r)", async () => {
    const cwd = await sandbox.runCode("getwd()", { language: "r" });
    expect(cwd.results[0]?.text.trim()).toBe(`[1] "${workDir}"`);
    const context = await sandbox.createCodeContext({ language: "r", cwd: "/tmp" });
    expect(context.language).toBe("r");
    const there = await sandbox.runCode("getwd()", { context });
    expect(there.results[0]?.text.trim()).toBe('[1] "/tmp"');
  });

  it("keeps state per context and reports R errors", async () => {
    await sandbox.runCode("counter <- 41", { language: "r" });
    expect((await sandbox.runCode("counter + 1", { language: "r" })).results[0]?.text).toBe("[1] 42");
    const failed = await sandbox.runCode('stop("boom")', { language: "R" });
    expect(failed.error?.name).toBe("ERROR");
    expect(failed.error?.value).toContain("boom");
  });
});

describe("java", () => {
  it("shows an expression's value with toString(), declarations show none", async () => {
    const declared = await sandbox.runCode("int x = 20;", { language: "java" });
    expect(declared.results).toEqual([]);
    const execution = await sandbox.runCode('System.out.println("hello"); String s = "x = "; s + (x * 2 + 2)', {
      language: "java",
    });
    expect(execution.logs.stdout).toEqual(["hello\n"]);
    expect(execution.results[0]?.text).toBe("x = 42");
    expect(execution.results[0]?.isMainResult).toBe(true);
  });

  it("reads sandbox-global env vars as properties and env, per-execution ones for one execution (E2B env_vars/java)", async () => {
    const global = await sandbox.runCode('System.getProperty("TEST_ENV_VAR")', { language: "java" });
    expect(global.results[0]?.text.trim()).toBe("supertest");
    const env = await sandbox.runCode('System.getenv("TEST_ENV_VAR")', { language: "java" });
    expect(env.results[0]?.text.trim()).toBe("supertest");
    const perExecution = await sandbox.runCode('System.getProperty("FOO") + "/" + System.getenv("FOO")', {
      language: "java",
      envs: { FOO: "bar" },
    });
    expect(perExecution.results[0]?.text.trim()).toBe("bar/bar");
    const after = await sandbox.runCode('System.getProperty("FOO", "default") + "/" + System.getenv("FOO")', {
      language: "java",
    });
    expect(after.results[0]?.text.trim()).toBe("default/null");
    const overwrite = await sandbox.runCode('System.getProperty("TEST_ENV_VAR")', {
      language: "java",
      envs: { TEST_ENV_VAR: "overwrite" },
    });
    expect(overwrite.results[0]?.text.trim()).toBe("overwrite");
    const restored = await sandbox.runCode('System.getProperty("TEST_ENV_VAR")', { language: "java" });
    expect(restored.results[0]?.text.trim()).toBe("supertest");
  });

  it("hands env vars to processes started with ProcessBuilder.environment()", async () => {
    const execution = await sandbox.runCode(
      'var pb = new ProcessBuilder("sh", "-c", "printf %s \\"$CHILD\\""); pb.environment(); new String(pb.start().getInputStream().readAllBytes())',
      { language: "java", envs: { CHILD: 'it\'s "here"' } },
    );
    expect(execution.results[0]?.text).toBe('it\'s "here"');
  });

  it("runs in the default cwd and in a context's own cwd (E2B cwd java)", async () => {
    const cwd = await sandbox.runCode('System.getProperty("user.dir")', { language: "java" });
    expect(cwd.results[0]?.text.trim()).toBe(workDir);
    const context = await sandbox.createCodeContext({ language: "java", cwd: "/tmp" });
    const there = await sandbox.runCode('System.getProperty("user.dir")', { context });
    expect(there.results[0]?.text.trim()).toBe("/tmp");
    const file = await sandbox.runCode('new java.io.File("rel").getAbsolutePath()', { context });
    expect(file.results[0]?.text).toBe("/tmp/rel");
  });

  it("reports exceptions, compilation errors and incomplete input as errors", async () => {
    const thrown = await sandbox.runCode('throw new IllegalStateException("boom")', { language: "java" });
    expect(thrown.error).toMatchObject({ name: "EvalException", value: "boom" });
    expect(thrown.error?.traceback).toContain("java.lang.IllegalStateException: boom");
    const compile = await sandbox.runCode('int y = "text";', { language: "java" });
    expect(compile.error?.name).toBe("CompilationException");
    expect(compile.error?.value).toContain("incompatible types");
    const incomplete = await sandbox.runCode("int z = (", { language: "java" });
    expect(incomplete.error?.name).toBe("IncompleteSourceException");
    // A failing cell leaves the kernel usable.
    expect((await sandbox.runCode("x + 1", { language: "java" })).results[0]?.text).toBe("21");
  });

  it("stops a busy loop when the client goes away, and the kernel keeps its state", async () => {
    await expect(sandbox.runCode("while (true) { }", { language: "java", timeoutMs: 2000 })).rejects.toThrow(
      TimeoutError,
    );
    expect((await sandbox.runCode("x", { language: "java" })).results[0]?.text).toBe("20");
  });

  it("survives System.exit in a cell: an error, then a fresh JVM", async () => {
    const exited = await sandbox.runCode("System.exit(3)", { language: "java" });
    expect(exited.error?.name).toBe("JavaExited");
    expect((await sandbox.runCode("1 + 1", { language: "java" })).results[0]?.text).toBe("2");
  });
});

describe("unsupported language", () => {
  it("answers 400 with the body E2B's gateway sends, on /execute and /contexts", async () => {
    const expected =
      'Failed to create context: {"message": "The \'cobol\' kernel is not available. Please pick another suitable ' +
      'kernel instead, or install that kernel.", "short_message": "cobol not found"}';
    for (const [path, body] of [
      ["/execute", { code: "1", language: " COBOL " }],
      ["/contexts", { language: "cobol" }],
    ] as const) {
      const res = await fetch(`${gateway.url}${path}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Access-Token": TOKEN },
        body: JSON.stringify(body),
      });
      expect(res.status).toBe(400);
      expect(res.headers.get("content-type")).toBe("text/plain; charset=utf-8");
      expect(await res.text()).toBe(expected);
    }
    await expect(sandbox.runCode("1", { language: "cobol" as never })).rejects.toThrow(/400/);
  });
});
