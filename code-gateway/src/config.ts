import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ConfigError, parseInteger as integer } from "@warren/platform/env";
import { CODE_GATEWAY_PORT, ENVD_PORT } from "@warren/proto/ports";

export { ConfigError };

/** Everything the code gateway reads from its command line and environment, parsed once at start. */
export interface GatewayConfig {
  /** TCP port; E2B's code-interpreter SDK expects 49999. */
  readonly port: number;
  /** Listen address. Loopback by default; inside a sandbox the template sets 0.0.0.0. */
  readonly host: string;
  /** Token required in X-Access-Token on /execute (envd's token); unset means no check. */
  readonly accessToken: string | undefined;
  /**
   * CODE_GATEWAY_AUTH=envd: with no token configured, ask envd whether the caller's X-Access-Token is
   * the sandbox's (a gateway in a warm-pool sandbox starts before /init gives envd its token).
   */
  readonly authFromEnvd: boolean;
  /** envd's base URL, for GET /envs (the sandbox-global environment variables). */
  readonly envdUrl: string;
  /** Working directory of contexts that name none. */
  readonly defaultCwd: string;
  /** Languages whose default context is created at start (python is always the default of defaults). */
  readonly startLanguages: readonly string[];
  /** The Python with Debian's ipykernel; the pyenv python3 on PATH lacks it. */
  readonly pythonPath: string;
  /** The Node binary that runs the JavaScript/TypeScript kernel. */
  readonly nodePath: string;
  /** R with Debian's IRkernel (r-cran-irkernel), for `r` contexts. */
  readonly rPath: string;
  /** A JDK's `java` (the jshell API and the source launcher), for `java` contexts. */
  readonly javaPath: string;
  /** Where kernel connection files and IPC sockets live (one directory per gateway process). */
  readonly runtimeDir: string;
  /** Silence on an /execute stream after which a keepalive line is written. */
  readonly keepaliveMs: number;
  /** How long a kernel may take to answer its first kernel_info_request, unless it is still using CPU. */
  readonly kernelStartTimeoutMs: number;
  /** The longest a kernel start that keeps using CPU may take (a busy node's slow start, not a stuck one). */
  readonly kernelStartCeilingMs: number;
  /** After an interrupt, how long the kernel has to go idle before it is restarted instead. */
  readonly interruptGraceMs: number;
  /** Longest an execution may run before the gateway interrupts it (0 = no limit). */
  readonly executionTimeoutMs: number;
  /** Timeout of the GET /envs call to envd. */
  readonly envdTimeoutMs: number;
  /** RLIMIT_NPROC of every kernel (KernelLaunch.processLimit); unset: none. */
  readonly processLimit: number | undefined;
  /** An inherited descriptor of the sandbox's workload cgroup, which every kernel joins (@warren/platform/workload). */
  readonly workloadFd: number | undefined;
}

export const USAGE = `usage: warren-code-gateway [--port 49999] [--host 127.0.0.1]
environment: CODE_GATEWAY_PORT, CODE_GATEWAY_HOST, CODE_GATEWAY_ACCESS_TOKEN (else ENVD_ACCESS_TOKEN),
  CODE_GATEWAY_ENVD_URL (http://127.0.0.1:49983), CODE_GATEWAY_DEFAULT_CWD (/home/user),
  CODE_GATEWAY_START_LANGUAGES (python,javascript), CODE_GATEWAY_PYTHON (/usr/bin/python3),
  CODE_GATEWAY_NODE (this node), CODE_GATEWAY_R (R), CODE_GATEWAY_JAVA (java), CODE_GATEWAY_RUNTIME_DIR (<tmp>/warren-cg-<pid>),
  CODE_GATEWAY_KEEPALIVE_MS (5000), CODE_GATEWAY_KERNEL_START_TIMEOUT_MS (30000),
  CODE_GATEWAY_KERNEL_START_CEILING_MS (300000),
  CODE_GATEWAY_INTERRUPT_GRACE_MS (5000), CODE_GATEWAY_EXECUTION_TIMEOUT_MS (0 = none),
  CODE_GATEWAY_ENVD_TIMEOUT_MS (2000), CODE_GATEWAY_PROCESS_LIMIT (RLIMIT_NPROC of kernels; unset = none),
  CODE_GATEWAY_WORKLOAD_FD (the workload cgroup's cgroup.procs, inherited; unset = none)`;

export function loadConfig(argv: readonly string[], env: NodeJS.ProcessEnv): GatewayConfig {
  let values: ReturnType<typeof parseFlags>["values"];
  try {
    values = parseFlags(argv).values;
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
  const envdUrl = (env.CODE_GATEWAY_ENVD_URL ?? `http://127.0.0.1:${ENVD_PORT}`).replace(/\/+$/, "");
  try {
    new URL(envdUrl);
  } catch {
    throw new ConfigError(`CODE_GATEWAY_ENVD_URL must be a URL, got '${envdUrl}'`);
  }
  const startLanguages = (env.CODE_GATEWAY_START_LANGUAGES ?? "python,javascript")
    .split(",")
    .map((l) => l.trim())
    .filter((l) => l.length > 0);
  return {
    port: integer("--port", values.port ?? env.CODE_GATEWAY_PORT ?? String(CODE_GATEWAY_PORT), 0, 65535),
    host: values.host ?? env.CODE_GATEWAY_HOST ?? "127.0.0.1",
    accessToken: env.CODE_GATEWAY_ACCESS_TOKEN || env.ENVD_ACCESS_TOKEN || undefined,
    authFromEnvd: env.CODE_GATEWAY_AUTH === "envd",
    envdUrl,
    defaultCwd: env.CODE_GATEWAY_DEFAULT_CWD ?? "/home/user",
    startLanguages,
    pythonPath: env.CODE_GATEWAY_PYTHON ?? "/usr/bin/python3",
    nodePath: env.CODE_GATEWAY_NODE ?? process.execPath,
    rPath: env.CODE_GATEWAY_R ?? "R",
    javaPath: env.CODE_GATEWAY_JAVA ?? "java",
    runtimeDir: env.CODE_GATEWAY_RUNTIME_DIR ?? join(tmpdir(), `warren-cg-${process.pid}`),
    keepaliveMs: integer("CODE_GATEWAY_KEEPALIVE_MS", env.CODE_GATEWAY_KEEPALIVE_MS ?? "5000", 10, 3_600_000),
    kernelStartTimeoutMs: integer(
      "CODE_GATEWAY_KERNEL_START_TIMEOUT_MS",
      env.CODE_GATEWAY_KERNEL_START_TIMEOUT_MS ?? "30000",
      100,
      600_000,
    ),
    kernelStartCeilingMs: integer(
      "CODE_GATEWAY_KERNEL_START_CEILING_MS",
      env.CODE_GATEWAY_KERNEL_START_CEILING_MS ?? "300000",
      100,
      3_600_000,
    ),
    interruptGraceMs: integer(
      "CODE_GATEWAY_INTERRUPT_GRACE_MS",
      env.CODE_GATEWAY_INTERRUPT_GRACE_MS ?? "5000",
      10,
      600_000,
    ),
    executionTimeoutMs: integer(
      "CODE_GATEWAY_EXECUTION_TIMEOUT_MS",
      env.CODE_GATEWAY_EXECUTION_TIMEOUT_MS ?? "0",
      0,
      86_400_000,
    ),
    envdTimeoutMs: integer("CODE_GATEWAY_ENVD_TIMEOUT_MS", env.CODE_GATEWAY_ENVD_TIMEOUT_MS ?? "2000", 1, 60_000),
    processLimit:
      env.CODE_GATEWAY_PROCESS_LIMIT === undefined || env.CODE_GATEWAY_PROCESS_LIMIT === ""
        ? undefined
        : integer("CODE_GATEWAY_PROCESS_LIMIT", env.CODE_GATEWAY_PROCESS_LIMIT, 1, 4_194_304),
    workloadFd:
      env.CODE_GATEWAY_WORKLOAD_FD === undefined || env.CODE_GATEWAY_WORKLOAD_FD === ""
        ? undefined
        : integer("CODE_GATEWAY_WORKLOAD_FD", env.CODE_GATEWAY_WORKLOAD_FD, 3, 1023),
  };
}

function parseFlags(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    options: { port: { type: "string" }, host: { type: "string" } },
    strict: true,
  });
}
