import { type Sandbox, TimeoutError } from "@e2b/code-interpreter";
import { afterAll, beforeAll, expect, it } from "vitest";
import { sdkSandbox, startTestGateway, type TestGateway } from "./harness.js";

// A client that gives up must not leave the kernel busy: the gateway interrupts it (or
// restarts it if the interrupt does not take), so the next execution runs at once.
let gateway: TestGateway;
let sandbox: Sandbox;
beforeAll(async () => {
  gateway = await startTestGateway();
  sandbox = sdkSandbox(gateway);
}, 60_000);
afterAll(async () => {
  await gateway?.stop();
});

async function timed<T>(run: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now();
  const value = await run();
  return { value, ms: performance.now() - started };
}

it("a 3 s client timeout on time.sleep(300) interrupts python; the next run returns within 10 s", async () => {
  await sandbox.runCode("kept = 'yes'");
  await expect(sandbox.runCode("import time; time.sleep(300)", { timeoutMs: 3000 })).rejects.toThrow(TimeoutError);
  const { value, ms } = await timed(() => sandbox.runCode("1 + 1"));
  expect(value.text).toBe("2");
  expect(ms).toBeLessThan(10_000);
  expect(gateway.logs()).toContain('"reason":"client disconnected"');
  // Interrupted, not restarted: the kernel kept its state.
  expect((await sandbox.runCode("kept")).text).toBe("yes");
});

it("a client timeout interrupts a synchronous JavaScript loop and the kernel keeps its state", async () => {
  await sandbox.runCode("var keptJs = 'yes'", { language: "js" });
  await expect(sandbox.runCode("while (true) {}", { language: "js", timeoutMs: 2000 })).rejects.toThrow(TimeoutError);
  const { value, ms } = await timed(() => sandbox.runCode("40 + 2", { language: "js" }));
  expect(value.text).toBe("42");
  expect(ms).toBeLessThan(10_000);
  expect((await sandbox.runCode("keptJs", { language: "js" })).text).toBe("yes");
  expect(gateway.logs()).not.toContain("kernel ignored the interrupt");
});

it("a client timeout interrupts a bash command and the shell keeps its state", async () => {
  await sandbox.runCode("KEPT=yes", { language: "bash" });
  await expect(sandbox.runCode("sleep 300", { language: "bash", timeoutMs: 2000 })).rejects.toThrow(TimeoutError);
  const { value, ms } = await timed(() => sandbox.runCode("echo $KEPT", { language: "bash" }));
  expect(value.logs.stdout.join("")).toContain("yes");
  expect(ms).toBeLessThan(10_000);
});

it("a crashed kernel gives the caller a KernelDied error and is restarted without its state", async () => {
  const context = await sandbox.createCodeContext();
  await sandbox.runCode("before_crash = 1", { context });
  const crash = await sandbox.runCode("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", { context });
  expect(crash.error?.name).toBe("KernelDied");
  expect(crash.error?.value).toMatch(/died \(signal SIGKILL\).*restarted/);
  const after = await sandbox.runCode("before_crash", { context });
  expect(after.error?.name).toBe("NameError");
  const works = await sandbox.runCode("2 * 21", { context });
  expect(works.text).toBe("42");
});

it("queued executions in one context run one at a time, in order", async () => {
  const context = await sandbox.createCodeContext();
  await sandbox.runCode("order = []", { context });
  await Promise.all(
    [1, 2, 3].map((n) => sandbox.runCode(`import time; time.sleep(0.2); order.append(${n})`, { context })),
  );
  const execution = await sandbox.runCode("order", { context });
  expect(execution.text).toBe("[1, 2, 3]");
});
