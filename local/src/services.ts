import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomInt } from "node:crypto";
import { chmodSync, chownSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join } from "node:path";

/** Ports freePort picks from start here; the range ends where the kernel's ephemeral range begins. */
const FREE_PORT_FLOOR = 20_000;

/** The first port of the kernel's ephemeral range (what `listen(0)` and outgoing connections take). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > FREE_PORT_FLOOR + 1000 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(false));
    // All IPv4 addresses: a port someone holds on any of them (loopback included) is not free.
    server.listen(port, "0.0.0.0", () => server.close(() => resolve(true)));
  });
}

/**
 * A free TCP port for a service a test or local cluster starts later, picked at random below the kernel's ephemeral
 * range. A port the kernel picked (`listen(0)`) was from that range, where any process binding port 0 or opening a
 * connection may be handed it again before our service binds it: a cluster that takes a minute to start (the
 * console test's proxy) once found its port answered by another test's server, and every request of its own failed.
 * Only another freePort caller can pick this one, one chance in thousands.
 */
export async function freePort(): Promise<number> {
  const span = ephemeralLow() - FREE_PORT_FLOOR;
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = FREE_PORT_FLOOR + randomInt(span);
    if (await canListen(port)) return port;
  }
  throw new Error(`no free port found between ${FREE_PORT_FLOOR} and ${FREE_PORT_FLOOR + span}`);
}

/** Thrown by a probe to stop waiting at once (e.g. the process being waited for has exited). */
export class GiveUp extends Error {}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (error) {
      if (error instanceof GiveUp) throw error;
      lastError = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${String(lastError)}` : ""}`);
}

/** A child process of the cluster, with its output in `<logDir>/<name>.log`. */
export interface ManagedChild {
  readonly name: string;
  readonly child: ChildProcess;
  readonly logFile: string;
  stop(signal?: NodeJS.Signals, graceMs?: number): Promise<void>;
}

export function startChild(
  name: string,
  command: string,
  args: readonly string[],
  options: { env?: NodeJS.ProcessEnv; logDir: string; cwd?: string; uid?: number; gid?: number },
): ManagedChild {
  mkdirSync(options.logDir, { recursive: true });
  const logFile = join(options.logDir, `${name}.log`);
  const out = openSync(logFile, "a");
  const child = spawn(command, args, {
    env: options.env ?? process.env,
    cwd: options.cwd,
    stdio: ["ignore", out, out],
    uid: options.uid,
    gid: options.gid,
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    name,
    child,
    logFile,
    async stop(signal = "SIGTERM", graceMs = 15_000) {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill(signal);
      const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** A private redis-server (nothing persisted): clusters never share the machine's Redis. */
export async function startPrivateRedis(
  logDir: string,
  fixedPort?: number,
): Promise<{ url: string; process: ManagedChild }> {
  const port = fixedPort ?? (await freePort());
  const redis = startChild(
    "redis",
    "redis-server",
    ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
    { logDir },
  );
  const url = `redis://127.0.0.1:${port}`;
  await waitFor(
    "redis",
    async () => {
      const { Redis } = await import("ioredis");
      const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
      client.on("error", () => undefined); // refused until the server listens; connect() rejects and we retry
      try {
        await client.connect();
        return (await client.ping()) === "PONG" ? true : undefined;
      } finally {
        client.disconnect();
      }
    },
    10_000,
  );
  return { url, process: redis };
}

const PG_BIN = () => {
  const versions = existsSync("/usr/lib/postgresql") ? readdirSync("/usr/lib/postgresql").sort() : [];
  const latest = versions.at(-1);
  if (!latest)
    throw new Error("PostgreSQL server binaries not found under /usr/lib/postgresql (apt-get install postgresql)");
  return `/usr/lib/postgresql/${latest}/bin`;
};

/**
 * A private PostgreSQL under `dataDir` (Debian's server binaries; runs as the `postgres` user, which
 * PostgreSQL requires). The cluster is created on first use and kept between runs.
 */
export async function startPrivatePostgres(
  dataDir: string,
  logDir: string,
  fixedPort?: number,
): Promise<{ url: string; process: ManagedChild }> {
  const bin = PG_BIN();
  const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
  const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
  const pgData = join(dataDir, "pgdata");
  const socketDir = join(dataDir, "pgsocket");
  for (const dir of [dataDir, socketDir]) {
    mkdirSync(dir, { recursive: true });
  }
  // The server runs as `postgres`, which must be able to reach its directories (mkdtemp makes 0700 ones).
  for (const dir of [dirname(dataDir), dataDir]) chmodSync(dir, 0o755);
  // Higher up is not ours to open (a home directory, say): a folder `postgres` cannot enter is named, not changed
  // (initdb would only say "Command failed").
  for (let dir = dirname(dirname(dataDir)); dir !== dirname(dir); dir = dirname(dir)) {
    const { mode, uid: owner } = statSync(dir);
    if (owner !== uid && (mode & 0o001) === 0) {
      throw new Error(
        `PostgreSQL (user postgres) cannot enter ${dir} (mode ${(mode & 0o777).toString(8)}): put the data dir elsewhere or chmod o+x it`,
      );
    }
  }
  chownSync(socketDir, uid, gid);
  if (!existsSync(join(pgData, "PG_VERSION"))) {
    mkdirSync(pgData, { recursive: true });
    chownSync(pgData, uid, gid);
    execFileSync(join(bin, "initdb"), ["-D", pgData, "-U", "postgres", "--auth=trust", "-E", "UTF8"], {
      uid,
      gid,
      stdio: "ignore",
    });
  }
  const port = fixedPort ?? (await freePort());
  const postgres = startChild(
    "postgres",
    join(bin, "postgres"),
    ["-D", pgData, "-p", String(port), "-k", socketDir, "-c", "listen_addresses=127.0.0.1"],
    { logDir, uid, gid },
  );
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  await waitFor(
    "postgres",
    async () => {
      const pg = await import("pg");
      const client = new pg.default.Client({ connectionString: url });
      try {
        await client.connect();
        await client.query("select 1");
        return true;
      } finally {
        await client.end().catch(() => undefined);
      }
    },
    20_000,
  );
  return { url, process: postgres };
}
