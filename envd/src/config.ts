import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { ConfigError, parseInteger as integer } from "@warren/platform/env";
import { type InheritedSpawner, parseInheritedSpawner } from "@warren/platform/spawner";
import { ENVD_PORT } from "@warren/proto/ports";

export { ConfigError };

/** Everything envd reads from its command line and environment, parsed once at start. */
export interface EnvdConfig {
  /** TCP port; E2B clients expect 49983. */
  readonly port: number;
  /** Listen address. Loopback by default: a host-side envd must not be reachable from the network. */
  readonly host: string;
  /** User for requests that name none, until /init sets one (E2B's built-in fallback is root). */
  readonly defaultUser: string;
  /** cwd for processes that name none, until /init sets one; unset means the user's home. */
  readonly defaultWorkdir: string | undefined;
  /** Access token required from the start (normally set later by /init). */
  readonly accessToken: string | undefined;
  /** Bytes of output each process keeps for replay to reconnecting clients. */
  readonly outputBufferBytes: number;
  /** How long a finished process's exit stays available to a late Connect. */
  readonly finishedRetentionMs: number;
  /** ENVD_LEASE_GRACE_MS (5000): between a lease's SIGTERM and its SIGKILL. */
  readonly leaseGraceMs: number;
  /** PATH every process starts with (envd's own, or a sane default). */
  readonly processPath: string;
  /** Sandbox-wide environment variables every process starts with. */
  readonly envVars: Readonly<Record<string, string>>;
  /**
   * Run one login shell through the whole Start path, so the first client command does not pay for V8's lazy
   * compilation, the modules and the fs-xattr addon its first calls load, and a cold page cache (a warm-pool
   * sandbox is then really warm).
   * `now`: right after listening (a pool's sandbox: nobody waits for it yet); `after-init`: once the first /init
   * has been answered (a cold start a user waits for: its /init must not queue behind the warm-up's ~70 ms of
   * CPU); `off`. `--warm-up`, else ENVD_WARMUP (`0` = off); default `now`.
   */
  readonly warmup: WarmupMode;
  /**
   * Forward ports that sandbox processes listen on at loopback only to the sandbox's own addresses, as E2B's envd
   * does (ports/loopback-forwarder.ts). Only inside a sandbox (the drivers pass --expose-loopback): a host-side
   * envd must never publish the host's loopback services.
   */
  readonly exposeLoopback: boolean;
  /**
   * `--process-limit N`: RLIMIT_NPROC (soft and hard) of every process envd starts, so they stop forking at N
   * processes and threads of their user while the sandbox's pids limit still leaves room for envd to start a
   * command or `kill` (the driver passes the sandbox's pids limit minus a reserve). Unset: no limit of envd's own.
   */
  readonly processLimit: number | undefined;
  /**
   * ENVD_EXEC_LAUNCHER: the static launcher every command starts through (`native/warren-exec.c`, built beside
   * envd's bundle as `dist/warren-exec`): process limit, groups, uid and exec in one exec. Where it is missing,
   * commands start through `prlimit` and `setpriv` instead (two execs: about 1.5 ms more per command).
   */
  readonly execLauncher: string;
  /**
   * ENVD_SPAWNER (1; 0 = off): pipe processes are forked by the launcher running as envd's spawner
   * (`warren-exec --serve`, process/spawner.ts) instead of by envd, whose fork copies its page tables (~3 ms).
   */
  readonly spawner: boolean;
  /**
   * WARREN_SPAWNER (set by `warren-exec --serve-beside`, which started the spawner before it exec'd envd): the
   * spawner to adopt instead of spawning one (`@warren/platform/spawner`). Removed from envd's environment at start.
   */
  readonly inheritedSpawner: InheritedSpawner | undefined;
  /**
   * `--workload-fd N`: an inherited descriptor of the sandbox's workload cgroup (process/workload.ts), which every
   * process envd starts joins. Unset: processes stay in envd's cgroup.
   */
  readonly workloadFd: number | undefined;
  /**
   * `--workload-oom-fd N`: an inherited, readable descriptor of the workload cgroup's `memory.oom_control`: a process
   * killed by SIGKILL while its count rose says "out of memory" in its error.
   */
  readonly workloadOomFd: number | undefined;
}

export type WarmupMode = "now" | "after-init" | "off";

export const USAGE = `usage: warren-envd [--port 49983] [--host 127.0.0.1] [--default-user root] [--default-workdir DIR] [--expose-loopback] [--process-limit N] [--workload-fd N] [--workload-oom-fd N] [--warm-up now|after-init|off]
environment: ENVD_ACCESS_TOKEN, ENVD_OUTPUT_BUFFER_BYTES (1048576), ENVD_FINISHED_RETENTION_MS (60000), ENVD_WARMUP (1; 0 = off),
ENVD_EXEC_LAUNCHER (warren-exec beside envd), ENVD_SPAWNER (1; 0 = envd forks commands itself)`;

export function loadConfig(argv: readonly string[], env: NodeJS.ProcessEnv): EnvdConfig {
  let parsed: ReturnType<typeof parseFlags>;
  try {
    parsed = parseFlags(argv);
  } catch (error) {
    throw new ConfigError((error as Error).message);
  }
  const { values } = parsed;
  return {
    port: integer("--port", values.port ?? env.ENVD_PORT ?? String(ENVD_PORT), 0, 65535),
    host: values.host ?? env.ENVD_HOST ?? "127.0.0.1",
    defaultUser: values["default-user"] ?? env.ENVD_DEFAULT_USER ?? "root",
    defaultWorkdir: values["default-workdir"] ?? env.ENVD_DEFAULT_WORKDIR,
    accessToken: env.ENVD_ACCESS_TOKEN || undefined,
    outputBufferBytes: integer("ENVD_OUTPUT_BUFFER_BYTES", env.ENVD_OUTPUT_BUFFER_BYTES ?? "1048576", 0, 1 << 30),
    finishedRetentionMs: integer(
      "ENVD_FINISHED_RETENTION_MS",
      env.ENVD_FINISHED_RETENTION_MS ?? "60000",
      0,
      86_400_000,
    ),
    leaseGraceMs: integer("ENVD_LEASE_GRACE_MS", env.ENVD_LEASE_GRACE_MS ?? "5000", 0, 3_600_000),
    processPath: env.PATH || "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    envVars: { E2B_SANDBOX: "true" },
    warmup: warmupMode(values["warm-up"], env.ENVD_WARMUP),
    exposeLoopback: values["expose-loopback"] === true,
    // Beside this module: dist/warren-exec for the bundle (dist/envd-main.cjs) and for tsc's output alike.
    execLauncher: env.ENVD_EXEC_LAUNCHER || fileURLToPath(new URL("./warren-exec", import.meta.url)),
    spawner: env.ENVD_SPAWNER !== "0",
    inheritedSpawner: parseInheritedSpawner(env.WARREN_SPAWNER),
    processLimit:
      values["process-limit"] === undefined
        ? undefined
        : integer("--process-limit", values["process-limit"], 1, 4_194_304),
    workloadFd:
      values["workload-fd"] === undefined ? undefined : integer("--workload-fd", values["workload-fd"], 3, 1023),
    workloadOomFd:
      values["workload-oom-fd"] === undefined
        ? undefined
        : integer("--workload-oom-fd", values["workload-oom-fd"], 3, 1023),
  };
}

function warmupMode(flag: string | undefined, env: string | undefined): WarmupMode {
  if (flag === undefined) return env === "0" ? "off" : "now";
  if (flag === "now" || flag === "after-init" || flag === "off") return flag;
  throw new ConfigError(`--warm-up must be now, after-init or off (got '${flag}')`);
}

function parseFlags(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    options: {
      port: { type: "string" },
      host: { type: "string" },
      "default-user": { type: "string" },
      "default-workdir": { type: "string" },
      "expose-loopback": { type: "boolean" },
      "process-limit": { type: "string" },
      "workload-fd": { type: "string" },
      "workload-oom-fd": { type: "string" },
      "warm-up": { type: "string" },
    },
    strict: true,
  });
}
