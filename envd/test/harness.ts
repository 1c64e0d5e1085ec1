import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Sandbox } from "e2b";
import { ENVD_VERSION } from "../src/version.js";

// Tests run what ships: the bundled envd, started as sandboxes start it (no V8 flags: instance-container.ts).
const MAIN = fileURLToPath(new URL("../dist/envd.cjs", import.meta.url));

export interface TestEnvd {
  readonly url: string;
  readonly port: number;
  readonly child: ChildProcess;
  /** Everything envd logged to stderr so far (tests check that no token appears in it). */
  logs(): string;
  stop(): Promise<void>;
}

export interface TestEnvdOptions {
  port?: number;
  accessToken?: string;
  defaultUser?: string;
  env?: Record<string, string>;
  /** Run envd's start-up warm-up (off by default so tests see only their own processes): at once, or after /init. */
  warmup?: boolean | "after-init";
  /** Node.js options before envd's launcher (a test's `--require` hook); sandboxes get none. */
  nodeArgs?: string[];
  /** Started behind its command spawner (`warren-exec --serve-beside`), as sandboxes start it. */
  spawnerBeside?: boolean;
  /**
   * A workload cgroup's `cgroup.procs`, opened for appending: handed to envd (and a spawner beside it) as fd 3, as
   * a sandbox's launcher hands it over (`--workload-fd`).
   */
  workloadProcsFd?: number;
}

/** The launcher sandboxes start envd behind (instance-container.ts). */
export const WARREN_EXEC = fileURLToPath(new URL("../dist/warren-exec", import.meta.url));

/** Starts the built envd as its own process, as root, the way a sandbox runs it. */
export async function startTestEnvd(options: TestEnvdOptions = {}): Promise<TestEnvd> {
  const args = [
    ...(options.nodeArgs ?? []),
    MAIN,
    "--port",
    String(options.port ?? 0),
    "--default-user",
    options.defaultUser ?? "user",
    ...(options.warmup === "after-init" ? ["--warm-up", "after-init"] : []),
    ...(options.workloadProcsFd === undefined ? [] : ["--workload-fd", "3"]),
  ];
  const workload = options.workloadProcsFd === undefined ? [] : [options.workloadProcsFd];
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    ENVD_WARMUP: options.warmup ? "1" : "0",
    ...options.env,
  };
  if (options.accessToken) env.ENVD_ACCESS_TOKEN = options.accessToken;
  const child = options.spawnerBeside
    ? spawn(
        WARREN_EXEC,
        [
          "--serve-beside",
          ...(options.workloadProcsFd === undefined ? [] : ["--workload-fd=3"]),
          "--",
          process.execPath,
          ...args,
        ],
        { env, stdio: ["ignore", "inherit", "pipe", ...workload] },
      )
    : spawn(process.execPath, args, { env, stdio: ["ignore", "inherit", "pipe", ...workload] });
  let stderr = "";
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`envd did not start: ${stderr}`)), 10_000);
    child.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
      const match = /"msg":"envd listening".*"port":(\d+)/.exec(stderr);
      if (match?.[1]) {
        clearTimeout(timer);
        resolve(Number(match[1]));
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`envd exited with ${code}: ${stderr}`));
    });
  });
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    child,
    logs: () => stderr,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
    },
  };
}

/**
 * An official e2b SDK Sandbox bound to a test envd. The SDK's constructor is what
 * Sandbox.create/connect call after the API answers; here the "API answer" is ours.
 */
export function sdkSandbox(envd: TestEnvd, options: { accessToken?: string } = {}): Sandbox {
  const SandboxClass = Sandbox as unknown as new (opts: Record<string, unknown>) => Sandbox;
  return new SandboxClass({
    sandboxId: "warren-test",
    envdVersion: ENVD_VERSION,
    envdAccessToken: options.accessToken,
    sandboxUrl: envd.url,
    debug: true,
  });
}

/** A fresh directory name under the test user's home, unique per test. */
export function scratchName(prefix = "t"): string {
  return `warren-test-${prefix}-${randomBytes(4).toString("hex")}`;
}

/** Minimal Connect JSON unary call, for tests of behaviour the SDK does not exercise. */
export async function connectUnary(
  envd: TestEnvd,
  method: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${envd.url}/${method}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "Connect-Protocol-Version": "1", ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}
