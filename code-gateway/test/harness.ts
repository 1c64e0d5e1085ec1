import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Sandbox } from "@e2b/code-interpreter";

const MAIN = fileURLToPath(new URL("../dist/main.js", import.meta.url));
const ENVD_MAIN = fileURLToPath(new URL("../../envd/dist/main.js", import.meta.url));

export interface TestProcess {
  readonly url: string;
  readonly port: number;
  readonly child: ChildProcess;
  /** Everything the process logged to stderr so far. */
  logs(): string;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export interface TestGateway extends TestProcess {
  /** The gateway's private directory; every kernel's command line names it. */
  readonly runtimeDir: string;
}

export interface TestGatewayOptions {
  accessToken?: string;
  /** Use the gateway's default runtime dir (<tmp>/warren-cg-<pid>) instead of a test one. */
  defaultRuntimeDir?: boolean;
  envdUrl?: string;
  env?: Record<string, string>;
}

/** Starts the built gateway as its own process (as root, the way a sandbox runs it), on a free port. */
export async function startTestGateway(options: TestGatewayOptions = {}): Promise<TestGateway> {
  const testRuntimeDir = join(tmpdir(), `wcg-test-${randomBytes(4).toString("hex")}`);
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    CODE_GATEWAY_RUNTIME_DIR: testRuntimeDir,
    // Nothing listens here unless a test starts envd: the gateway must cope.
    CODE_GATEWAY_ENVD_URL: options.envdUrl ?? "http://127.0.0.1:9",
    ...options.env,
  };
  delete env.E2B_DEBUG;
  if (options.defaultRuntimeDir) delete env.CODE_GATEWAY_RUNTIME_DIR;
  if (options.accessToken) env.CODE_GATEWAY_ACCESS_TOKEN = options.accessToken;
  const proc = await startLogged([MAIN, "--port", "0"], env, /"msg":"code gateway listening".*"port":(\d+)/, 60_000);
  const runtimeDir = options.defaultRuntimeDir ? join(tmpdir(), `warren-cg-${proc.child.pid}`) : testRuntimeDir;
  return { ...proc, runtimeDir };
}

/** Starts Warren's real envd (built) on a free port, for GET /envs. */
export function startTestEnvd(accessToken?: string): Promise<TestProcess> {
  const env: Record<string, string> = { ...(process.env as Record<string, string>) };
  if (accessToken) env.ENVD_ACCESS_TOKEN = accessToken;
  return startLogged(
    [ENVD_MAIN, "--port", "0", "--default-user", "user"],
    env,
    /"msg":"envd listening".*"port":(\d+)/,
    15_000,
  );
}

async function startLogged(
  args: string[],
  env: Record<string, string>,
  ready: RegExp,
  timeoutMs: number,
): Promise<TestProcess> {
  const child = spawn(process.execPath, args, { env, stdio: ["ignore", "inherit", "pipe"] });
  let stderr = "";
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${args[0]} did not start: ${stderr}`)), timeoutMs);
    child.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
      const match = ready.exec(stderr);
      if (match?.[1]) {
        clearTimeout(timer);
        resolve(Number(match[1]));
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${args[0]} exited with ${code}: ${stderr}`));
    });
  });
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    child,
    logs: () => stderr,
    async stop(signal: NodeJS.Signals = "SIGTERM") {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill(signal);
      await exited;
    },
  };
}

/**
 * The official code-interpreter SDK bound to a test gateway. Its constructor is what
 * Sandbox.create/connect call after the API answers; `sandboxUrl` is where it sends
 * /execute and /contexts (jupyterUrl).
 */
export function sdkSandbox(gateway: TestProcess, options: { accessToken?: string } = {}): Sandbox {
  const SandboxClass = Sandbox as unknown as new (opts: Record<string, unknown>) => Sandbox;
  return new SandboxClass({
    sandboxId: "warren-test",
    envdVersion: "0.6.4",
    envdAccessToken: options.accessToken,
    sandboxUrl: gateway.url,
    debug: true,
  });
}

/** Pids of live processes whose command line mentions `needle` (kernels name their runtime dir). */
export function processesMentioning(needle: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
      const state = /^State:\s+(\S)/m.exec(readFileSync(`/proc/${entry}/status`, "utf8"))?.[1];
      if (cmdline.includes(needle) && state !== "Z") pids.push(Number(entry));
    } catch {
      // the process exited while we looked
    }
  }
  return pids;
}

/** Waits until `check` holds or the time is up; returns its last value. */
export async function eventually<T>(check: () => T, ok: (v: T) => boolean, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let value = check();
  while (!ok(value) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    value = check();
  }
  return value;
}
