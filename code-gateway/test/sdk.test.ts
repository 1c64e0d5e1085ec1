import type { Sandbox } from "@e2b/code-interpreter";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { processesMentioning, sdkSandbox, startTestGateway, type TestGateway } from "./harness.js";

// The official @e2b/code-interpreter SDK against one real gateway with real kernels:
// the scenarios of e2b-dev/code-interpreter js/tests that need no cluster.
let gateway: TestGateway;
let sandbox: Sandbox;
beforeAll(async () => {
  gateway = await startTestGateway();
  sandbox = sdkSandbox(gateway);
}, 60_000);
afterAll(async () => {
  await gateway?.stop();
  // Every kernel (and the directory holding their sockets) went with the gateway.
  expect(processesMentioning(gateway.runtimeDir)).toEqual([]);
});

describe("python", () => {
  it("runCode('x=1; x') returns the main result text 1", async () => {
    const execution = await sandbox.runCode("x=1; x");
    expect(execution.text).toBe("1");
    expect(execution.results[0]?.isMainResult).toBe(true);
  });

  it("calls onStdout, onStderr, onResult and onError exactly once each", async () => {
    const onStdout = vi.fn();
    const onStderr = vi.fn();
    const onResult = vi.fn();
    const onError = vi.fn();
    await sandbox.runCode('import sys; print("hello"); print("oops", file=sys.stderr); 42', {
      onStdout,
      onStderr,
      onResult,
    });
    await sandbox.runCode("undefined_name_xyz", { onError });
    expect(onStdout).toHaveBeenCalledOnce();
    expect(onStdout.mock.calls[0]?.[0]).toMatchObject({ line: "hello\n", error: false });
    expect(onStderr).toHaveBeenCalledOnce();
    expect(onStderr.mock.calls[0]?.[0]).toMatchObject({ line: "oops\n", error: true });
    expect(onResult).toHaveBeenCalledOnce();
    expect(onError).toHaveBeenCalledOnce();
    expect(onError.mock.calls[0]?.[0]).toMatchObject({ name: "NameError" });
  });

  it("runs the kernel with OOM score 1000: the user's code is killed before the gateway and envd", async () => {
    const own = (await sandbox.runCode("open('/proc/self/oom_score_adj').read().strip()")).text;
    expect(own).toBe("1000");
    const child = await sandbox.runCode(
      "import subprocess; subprocess.run(['cat', '/proc/self/oom_score_adj'], capture_output=True, text=True).stdout.strip()",
    );
    expect(child.text).toBe("1000");
  });

  it("keeps state between calls", async () => {
    await sandbox.runCode("state_test = 41");
    const execution = await sandbox.runCode("state_test + 1");
    expect(execution.text).toBe("42");
  });

  it("keeps state for a second SDK instance, as after Sandbox.connect", async () => {
    await sandbox.runCode("reconnect_test = 'same kernel'");
    const reconnected = sdkSandbox(gateway);
    expect((await reconnected.runCode("reconnect_test")).text).toBe("same kernel");
  });

  it("counts executions per context (executionCount)", async () => {
    const context = await sandbox.createCodeContext();
    await sandbox.runCode("1", { context });
    const second = await sandbox.runCode("2", { context });
    expect(second.executionCount).toBe(2);
  });

  it("reports a Python exception as execution.error, not an HTTP error", async () => {
    const execution = await sandbox.runCode("1/0");
    expect(execution.error?.name).toBe("ZeroDivisionError");
    expect(execution.error?.value).toBe("division by zero");
    expect(execution.error?.traceback).toContain("ZeroDivisionError");
  });

  it("runs in /home/user by default, with quotes stripped from the text", async () => {
    const execution = await sandbox.runCode("import os; os.getcwd()");
    expect(execution.text).toBe("/home/user");
  });

  it("returns a matplotlib plt.show() figure as a PNG result", async () => {
    const execution = await sandbox.runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('w')\nplt.show()",
    );
    const figure = execution.results[0];
    expect(figure?.png).toBeTruthy();
    expect(
      Buffer.from(figure?.png ?? "", "base64")
        .subarray(1, 4)
        .toString(),
    ).toBe("PNG");
    expect(figure?.text).toContain("Figure");
    expect(figure?.isMainResult).toBe(false);
    expect(figure?.extra).toEqual({});
  });

  it("returns a pandas DataFrame as html plus data", async () => {
    const execution = await sandbox.runCode(
      "import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})",
    );
    const result = execution.results[0];
    expect(result?.html).toContain("<table");
    expect(result?.data).toEqual({ a: [1, 2, 3], b: ["x", "y", "z"] });
  });

  it("returns PIL images as PNG results from show(), from the cell value and from save()", async () => {
    const prefix =
      "import numpy\nfrom PIL import Image\nimage = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype('uint8')).convert('RGBA')\n";
    for (const last of ["image.show()\nprint('done')", "image", "image.save('/tmp/warren-pil-test.png')"]) {
      const execution = await sandbox.runCode(prefix + last);
      expect(execution.error).toBeUndefined();
      expect(execution.results[0]?.png).toBeTruthy();
    }
  });

  it("streams a plot and an expression as two results, and one stdout and one stderr line", async () => {
    const execution = await sandbox.runCode(
      "import sys, matplotlib.pyplot as plt\nprint(1)\nprint(2, file=sys.stderr)\nplt.plot([1,2]); plt.show()\n3",
    );
    expect(execution.logs.stdout).toEqual(["1\n"]);
    expect(execution.logs.stderr).toEqual(["2\n"]);
    expect(execution.results).toHaveLength(2);
    expect(execution.results[1]?.text).toBe("3");
  });
});

describe("contexts", () => {
  it("creates a context with a cwd and lists it last, next to the default python and javascript ones", async () => {
    const context = await sandbox.createCodeContext({ language: "python", cwd: "/root" });
    expect(context).toMatchObject({ language: "python", cwd: "/root" });
    const cwd = await sandbox.runCode("import os; os.getcwd()", { context });
    expect(cwd.text).toBe("/root");
    const contexts = await sandbox.listCodeContexts();
    expect(contexts.at(-1)?.id).toBe(context.id);
    const languages = contexts.map((c) => c.language);
    expect(languages).toContain("python");
    expect(languages).toContain("javascript");
  });

  it("runs a new context independently of the default one", async () => {
    await sandbox.runCode("independent = 1");
    const context = await sandbox.createCodeContext();
    const execution = await sandbox.runCode("independent", { context });
    expect(execution.error?.name).toBe("NameError");
  });

  it("removes a context: it is no longer listed and running in it gives NotFoundError", async () => {
    const context = await sandbox.createCodeContext();
    await sandbox.removeCodeContext(context);
    const contexts = await sandbox.listCodeContexts();
    expect(contexts.map((c) => c.id)).not.toContain(context.id);
    await expect(sandbox.runCode("1", { context })).rejects.toThrow(/not found/);
  });

  it("restarts a context: state is lost (NameError)", async () => {
    const context = await sandbox.createCodeContext();
    await sandbox.runCode("x = 1", { context });
    await sandbox.restartCodeContext(context);
    const execution = await sandbox.runCode("x", { context });
    expect(execution.error?.name).toBe("NameError");
    expect(execution.error?.value).toBe("name 'x' is not defined");
  });

  it("restarting a context during an execution ends it with a ContextRestarting error", async () => {
    const context = await sandbox.createCodeContext();
    const running = sandbox.runCode("import time; time.sleep(300)", { context });
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await sandbox.restartCodeContext(context);
    const execution = await running;
    expect(execution.error).toMatchObject({ name: "ContextRestarting", value: "Context was restarted" });
    expect((await sandbox.runCode("1 + 1", { context })).text).toBe("2");
  });

  it("rejects context and language together in the SDK", async () => {
    const context = await sandbox.createCodeContext();
    await expect(sandbox.runCode("1", { context, language: "python" })).rejects.toThrow(/context or language/);
  });
});

describe("javascript and typescript", () => {
  it("runs JavaScript with console output and a result", async () => {
    const execution = await sandbox.runCode('console.log("Hello World!"); 1 + 1', { language: "js" });
    expect(execution.logs.stdout).toEqual(["Hello World!\n"]);
    expect(execution.text).toBe("2");
  });

  it("supports an ESM import in a JavaScript cell, and the binding outlives the cell", async () => {
    const execution = await sandbox.runCode("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", {
      language: "javascript",
    });
    expect(execution.error).toBeUndefined();
    expect(execution.logs.stdout).toEqual(["function\n"]);
    const later = await sandbox.runCode("typeof readFileSync", { language: "javascript" });
    expect(later.text).toBe("function");
  });

  it("keeps JavaScript state and awaits a promise result", async () => {
    await sandbox.runCode("var counter = 10", { language: "js" });
    const execution = await sandbox.runCode("Promise.resolve(counter + 1)", { language: "js" });
    expect(execution.text).toBe("11");
  });

  it("supports top-level await, returning the awaited value and keeping declarations", async () => {
    const execution = await sandbox.runCode(
      "\n    async function main() {\n        return 'Hello, World!'\n    }\n\n    const greeting = await main()\n    greeting\n",
      { language: "js" },
    );
    expect(execution.error).toBeUndefined();
    expect(execution.results[0]?.text).toBe("Hello, World!");
    expect((await sandbox.runCode("greeting.length", { language: "js" })).text).toBe("13");
  });

  it("runs E2B's js language cases: es6 arrow result, const across cells, cwd of a new context", async () => {
    expect((await sandbox.runCode("\nconst add = (x, y) => x + y;\nadd(1, 2)\n", { language: "js" })).text).toBe("3");
    await sandbox.runCode("const z = 1", { language: "js" });
    expect((await sandbox.runCode("z", { language: "js" })).text).toBe("1");
    const context = await sandbox.createCodeContext({ cwd: "/home", language: "js" });
    expect((await sandbox.runCode("process.cwd()", { context })).text).toBe("/home");
  });

  it("runs a TypeScript function with typed parameters (E2B's ts simple)", async () => {
    const execution = await sandbox.runCode(
      "\nfunction subtract(x: number, y: number): number {\n  return x - y;\n}\n\nsubtract(1, 2)\n",
      { language: "ts" },
    );
    expect(execution.results[0]?.text).toBe("-1");
  });

  it("reports a JavaScript exception as execution.error", async () => {
    const execution = await sandbox.runCode("throw new TypeError('bad input')", { language: "js" });
    expect(execution.error).toMatchObject({ name: "TypeError", value: "bad input" });
  });

  it("runs TypeScript with type annotations and imports", async () => {
    const execution = await sandbox.runCode(
      'import * as path from "node:path"\nconst message: string = "Hello World!"; console.log(message, path.sep)',
      { language: "ts" },
    );
    expect(execution.error).toBeUndefined();
    expect(execution.logs.stdout).toEqual(["Hello World! /\n"]);
  });

  it("runs JavaScript in /home/user", async () => {
    const js = await sandbox.runCode("process.cwd()", { language: "js" });
    expect(js.text).toBe("/home/user");
    const ts = await sandbox.runCode("process.cwd() as string", { language: "typescript" });
    expect(ts.text).toBe("/home/user");
  });
});

describe("bash", () => {
  it("runs bash, keeps variables, functions and cwd between cells", async () => {
    const first = await sandbox.runCode('GREETING=hi; greet() { echo "$GREETING $1"; }; cd /tmp; pwd', {
      language: "bash",
    });
    expect(first.logs.stdout.join("")).toBe("/tmp\n");
    const second = await sandbox.runCode("greet there; pwd", { language: "bash" });
    expect(second.logs.stdout.join("")).toBe("hi there\n/tmp\n");
  });

  it("starts bash contexts in /home/user", async () => {
    const context = await sandbox.createCodeContext({ language: "bash" });
    const execution = await sandbox.runCode("pwd", { context });
    expect(execution.logs.stdout.join("")).toBe("/home/user\n");
  });
});

describe("per-execution env vars", () => {
  it("applies env vars for one python execution and then removes them", async () => {
    const withVar = await sandbox.runCode("import os; os.getenv('WARREN_FOO')", { envs: { WARREN_FOO: "bar" } });
    expect(withVar.text).toBe("bar");
    const without = await sandbox.runCode("import os; os.getenv('WARREN_FOO')");
    expect(without.text).toBeUndefined();
  });

  it("applies env vars for one javascript execution and then removes them", async () => {
    const withVar = await sandbox.runCode("process.env.WARREN_FOO", { language: "js", envs: { WARREN_FOO: "bar" } });
    expect(withVar.text).toBe("bar");
    const without = await sandbox.runCode("process.env.WARREN_FOO", { language: "js" });
    expect(without.text).toBeUndefined();
  });

  it("applies env vars for one bash execution and then removes them", async () => {
    const withVar = await sandbox.runCode('echo "[$WARREN_FOO]"', { language: "bash", envs: { WARREN_FOO: "b'ar" } });
    expect(withVar.logs.stdout.join("")).toBe("[b'ar]\n");
    const without = await sandbox.runCode('echo "[$WARREN_FOO]"', { language: "bash" });
    expect(without.logs.stdout.join("")).toBe("[]\n");
  });
});

describe("bad input", () => {
  const post = (path: string, body: string) =>
    fetch(`${gateway.url}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body });

  it("answers 404 for an unknown context, which the SDK maps to NotFoundError", async () => {
    const res = await post("/execute", JSON.stringify({ code: "1", context_id: "no-such-context" }));
    expect(res.status).toBe(404);
    expect(await res.text()).toBe("Context no-such-context not found");
    await expect(sandbox.runCode("1", { context: { id: "nope", language: "python", cwd: "/" } })).rejects.toThrow(
      "Context nope not found",
    );
  });

  it("answers 400 when both context_id and language are given", async () => {
    const contexts = await sandbox.listCodeContexts();
    const res = await post("/execute", JSON.stringify({ code: "1", context_id: contexts[0]?.id, language: "python" }));
    expect(res.status).toBe(400);
  });

  it("answers 400 for malformed JSON, a missing code field and an unsupported language", async () => {
    expect((await post("/execute", "{not json")).status).toBe(400);
    expect((await post("/execute", JSON.stringify({ language: "python" }))).status).toBe(400);
    expect((await post("/execute", JSON.stringify({ code: "1", language: "cobol" }))).status).toBe(400);
    expect((await post("/contexts", "{not json")).status).toBe(400);
  });

  it("answers 404 when removing or restarting an unknown context", async () => {
    await expect(sandbox.removeCodeContext("no-such")).rejects.toThrow(/not found/);
    await expect(sandbox.restartCodeContext("no-such")).rejects.toThrow(/not found/);
  });

  it('answers GET /health with 200 "OK"', async () => {
    const res = await fetch(`${gateway.url}/health`);
    expect(res.status).toBe(200);
    expect(await res.json()).toBe("OK");
  });

  it("answers GET /warren/ready with 200 once the default kernels have started", async () => {
    const res = await fetch(`${gateway.url}/warren/ready`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ kernels: "started" });
  });
});
