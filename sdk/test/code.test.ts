import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { startTestGateway, type TestGateway } from "../../code-gateway/test/harness.js";
import { InvalidArgumentError, NotFoundError, type OutputMessage, Sandbox } from "../src/index.js";
import { ENVD_VERSION } from "./harness.js";

let gateway: TestGateway;
let sandbox: Sandbox;

beforeAll(async () => {
  gateway = await startTestGateway({ accessToken: "code-token" });
  sandbox = new Sandbox({
    sandboxId: "warrentest",
    envdVersion: ENVD_VERSION,
    envdAccessToken: "code-token",
    sandboxUrl: gateway.url,
    apiKey: "k",
  });
}, 90_000);
afterAll(async () => {
  await gateway?.stop();
});

describe("runCode and code contexts", () => {
  test("runCode returns the main result, logs and execution count, streaming stdout", async () => {
    const stdout: OutputMessage[] = [];
    const execution = await sandbox.runCode("print('hi')\nx = 41\nx + 1", { onStdout: (m) => void stdout.push(m) });
    expect(execution.text).toBe("42");
    expect(execution.logs.stdout).toEqual(["hi\n"]);
    expect(stdout.map((m) => m.line)).toEqual(["hi\n"]);
    expect(execution.executionCount).toBeGreaterThan(0);
    expect(execution.error).toBeUndefined();
  });

  test("an exception in the code is an execution error, not a thrown one", async () => {
    const execution = await sandbox.runCode("undefined_name_xyz");
    expect(execution.error?.name).toBe("NameError");
    expect(execution.error?.value).toContain("undefined_name_xyz");
  });

  test("a context keeps its own state; restart clears it; remove deletes it", async () => {
    const context = await sandbox.createCodeContext({ language: "python", cwd: "/tmp" });
    expect(context).toMatchObject({ language: "python", cwd: "/tmp" });
    await sandbox.runCode("y = 'kept'", { context });
    expect((await sandbox.runCode("y", { context })).text).toBe("kept");
    expect((await sandbox.runCode("import os; os.getcwd()", { context })).text).toBe("/tmp");
    expect((await sandbox.listCodeContexts()).some((c) => c.id === context.id)).toBe(true);
    await sandbox.restartCodeContext(context);
    expect((await sandbox.runCode("y", { context })).error?.name).toBe("NameError");
    await sandbox.removeCodeContext(context.id);
    expect((await sandbox.listCodeContexts()).some((c) => c.id === context.id)).toBe(false);
    await expect(sandbox.runCode("1", { context })).rejects.toBeInstanceOf(NotFoundError);
  });

  test("language selects a kernel; language and context together are rejected client-side", async () => {
    expect((await sandbox.runCode("1 + 2", { language: "javascript" })).text).toBe("3");
    const context = { id: "any", language: "python", cwd: "/" };
    await expect(sandbox.runCode("1", { language: "python", context })).rejects.toBeInstanceOf(InvalidArgumentError);
  });
});
