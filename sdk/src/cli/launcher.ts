/**
 * The process `warren up` leaves running: it starts Warren's single-node cluster with `@warren/local` (the
 * checkout's local cluster launcher, which the whole-cluster tests use too), writes `<dataDir>/env`, and on SIGTERM/SIGINT stops every
 * process it started (node agents remove their sandboxes) and removes its pid file. It reports progress
 * to `warren up` over the IPC channel when there is one, and writes the same lines to its log.
 */
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { WARREN_HOME } from "./config.js";
import { type LaunchMessage, type LaunchSpec, pidFileOf } from "./launch-spec.js";

/** The part of `@warren/local`'s LocalCluster the launcher uses (imported at run time from the checkout). */
interface Cluster {
  start(): Promise<Record<string, string>>;
  stop(): Promise<void>;
  writeEnvFile(path?: string): string;
}
type ClusterClass = new (options: Record<string, unknown>) => Cluster;
const LOCAL_CLUSTER_PACKAGE = "@warren/local";

function send(message: LaunchMessage): void {
  const line = message.type === "progress" ? message.line : message.type === "failed" ? message.error : "ready";
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), ...message, env: undefined, line })}\n`);
  if (process.send && process.connected) process.send(message);
}

async function main(): Promise<void> {
  const spec = JSON.parse(process.env.WARREN_LAUNCH ?? "{}") as LaunchSpec;
  if (!spec.dataDir) throw new Error("WARREN_LAUNCH must name a dataDir");
  mkdirSync(join(spec.dataDir, "logs"), { recursive: true });
  const pidFile = pidFileOf(spec.dataDir);
  writeFileSync(pidFile, `${process.pid}\n`);
  // `warren up` may go away once we are ready; its channel closing must not end us.
  process.on("disconnect", () => undefined);

  const { LocalCluster } = await loadLocalCluster();
  const cidrs = spec.nodeCidrs ?? [];
  const cluster = new LocalCluster({
    dataDir: spec.dataDir,
    ...(spec.apiPort ? { apiPort: spec.apiPort } : {}),
    ...(spec.proxyPort ? { proxyPort: spec.proxyPort } : {}),
    ...(spec.nodeAgents ? { nodeAgents: spec.nodeAgents } : {}),
    ...(spec.poolSize !== undefined ? { poolSize: spec.poolSize } : {}),
    ...(spec.instancePrefix ? { instancePrefix: spec.instancePrefix } : {}),
    ...(cidrs.length > 0 ? { nodeCidr: (i: number) => cidrs[Math.min(i, cidrs.length - 1)] } : {}),
    ...(spec.databaseUrl ? { databaseUrl: spec.databaseUrl } : {}),
    ...(spec.redisUrl ? { redisUrl: spec.redisUrl } : {}),
    ...(spec.tls ? { tls: spec.tls } : {}),
    // E2B's code interpreter template: made in the background, announced when ready (minutes on a first start).
    laterTemplates: ["code-interpreter-v1"],
    onProgress: (line: string) => send({ type: "progress", line }),
  });

  let stopping: Promise<void> | undefined;
  const stop = (signal: string) => {
    stopping ??= (async () => {
      send({ type: "progress", line: `${signal}: stopping (sandboxes are removed)` });
      await cluster.stop();
      // Only our own pid file: a newer launcher may have replaced it.
      if (existsSync(pidFile) && readFileSync(pidFile, "utf8").trim() === String(process.pid)) rmSync(pidFile);
      process.exit(0);
    })();
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGHUP", () => stop("SIGHUP"));

  try {
    const env = await cluster.start();
    const envFile = cluster.writeEnvFile(join(spec.dataDir, "env"));
    if (!stopping) send({ type: "ready", env, envFile });
  } catch (error) {
    if (stopping) return;
    send({ type: "failed", error: (error as Error).message });
    rmSync(pidFile, { force: true });
    process.exit(1);
  }
}

main().catch((error: Error) => {
  send({ type: "failed", error: error.message });
  process.exit(1);
});

/**
 * `@warren/local` is a workspace of the Warren checkout, not a dependency of the published SDK: it is resolved by
 * package name from the checkout this CLI runs in, and a checkout that was not built says so.
 */
async function loadLocalCluster(): Promise<{ LocalCluster: ClusterClass }> {
  const name: string = LOCAL_CLUSTER_PACKAGE;
  try {
    return (await import(name)) as { LocalCluster: ClusterClass };
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code !== "ERR_MODULE_NOT_FOUND" && code !== "ERR_PACKAGE_PATH_NOT_EXPORTED") throw error;
    throw new Error(`${LOCAL_CLUSTER_PACKAGE} is not built in ${WARREN_HOME}: run \`npm run build\` there`);
  }
}
