import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const MAIN = fileURLToPath(new URL("../dist/main.js", import.meta.url));
const ENV = fileURLToPath(new URL("../dist/env.js", import.meta.url));
const LOG = fileURLToPath(new URL("../dist/log.js", import.meta.url));

/** Runs a tiny program built on runMain; `body` is the start function's body. */
function program(body: string, extra = "") {
  const source = `
    import { runMain } from ${JSON.stringify(MAIN)};
    import { ConfigError } from ${JSON.stringify(ENV)};
    import { createLogger } from ${JSON.stringify(LOG)};
    const log = createLogger("demo");
    runMain(async () => { ${body} }, { name: "demo", log, usage: "usage: demo [--flag]" ${extra} });
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", source], { stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk;
  });
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
  });
  const exited = once(child, "exit").then(([code]) => code as number);
  return { child, exited, output: () => ({ stdout, stderr }) };
}

describe("runMain", () => {
  it("on SIGTERM stops the started process once, logs it, and exits 0", async () => {
    const run = program(`
      setTimeout(() => process.stdout.write("ready\\n"), 10);
      setInterval(() => {}, 1000);
      return { stop: async (signal) => { process.stdout.write("stopped by " + signal + "\\n"); } };
    `);
    await new Promise<void>((resolve) => run.child.stdout.once("data", () => resolve()));
    run.child.kill("SIGTERM");
    expect(await run.exited).toBe(0);
    expect(run.output().stdout).toBe("ready\nstopped by SIGTERM\n");
    expect(JSON.parse(run.output().stderr)).toMatchObject({ level: "info", component: "demo", msg: "stopping" });
  });

  it("exits 1 and logs the error when stopping fails", async () => {
    const run = program(`
      setTimeout(() => process.stdout.write("ready\\n"), 10);
      setInterval(() => {}, 1000);
      return { stop: async () => { throw new Error("drain timed out"); } };
    `);
    await new Promise<void>((resolve) => run.child.stdout.once("data", () => resolve()));
    run.child.kill("SIGINT");
    expect(await run.exited).toBe(1);
    expect(run.output().stderr).toContain('"msg":"stop failed","error":"drain timed out"');
  });

  it("prints a configuration error with the usage and exits 2", async () => {
    const run = program(`throw new ConfigError("PORT must be an integer in [0, 65535], got 'x'");`);
    expect(await run.exited).toBe(2);
    expect(run.output().stderr).toBe("demo: PORT must be an integer in [0, 65535], got 'x'\nusage: demo [--flag]\n");
  });

  it("logs any other failure to start and exits 1, with no unhandled rejection", async () => {
    const run = program(`throw new Error("address in use");`);
    expect(await run.exited).toBe(1);
    const line = JSON.parse(run.output().stderr);
    expect(line).toMatchObject({ level: "error", msg: "failed to start", error: "address in use" });
  });

  it("treats an error the program explains as a usage error", async () => {
    const run = program(
      `throw Object.assign(new Error("no KVM"), { reasons: ["/dev/kvm is PVM"] });`,
      `, explainUsageError: (e) => e.message + " (" + e.reasons.join("; ") + ")"`,
    );
    expect(await run.exited).toBe(2);
    expect(run.output().stderr).toBe("demo: no KVM (/dev/kvm is PVM)\nusage: demo [--flag]\n");
  });
});
