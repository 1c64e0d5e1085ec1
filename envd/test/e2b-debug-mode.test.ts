import { Sandbox } from "e2b";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startTestEnvd, type TestEnvd } from "./harness.js";

// E2B_DEBUG=true is how E2B's own SDK tests talk to a single envd: no API, envd at
// http://localhost:49983. This proves that mode works against Warren's envd unchanged.
let envd: TestEnvd;
let previousDebug: string | undefined;
beforeAll(async () => {
  envd = await startTestEnvd({ port: 49983 });
  previousDebug = process.env.E2B_DEBUG;
  process.env.E2B_DEBUG = "true";
});
afterAll(async () => {
  if (previousDebug === undefined) delete process.env.E2B_DEBUG;
  else process.env.E2B_DEBUG = previousDebug;
  await envd.stop();
});

it("Sandbox.create() in E2B_DEBUG mode runs a command and round-trips a file through localhost:49983", async () => {
  const sandbox = await Sandbox.create();
  expect(await sandbox.isRunning()).toBe(true);
  const run = await sandbox.commands.run("echo hello from warren && id -un");
  expect(run.exitCode).toBe(0);
  expect(run.stdout).toBe("hello from warren\nuser\n");
  const name = `warren-debug-${process.pid}.txt`;
  await sandbox.files.write(name, "round trip");
  expect(await sandbox.files.read(name)).toBe("round trip");
  await sandbox.files.remove(name);
  expect(await sandbox.files.exists(name)).toBe(false);
});
