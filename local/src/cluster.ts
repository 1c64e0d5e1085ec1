import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { rm } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ClusterRedis } from "./cluster-redis.js";
import { unmountUnder } from "./mounts.js";
import { ProcessEnv } from "./process-env.js";
import { assertRunning, waitForHttp, waitForTls } from "./readiness.js";
import { clusterSecrets } from "./secrets.js";
import {
  freePort,
  type ManagedChild,
  startChild,
  startPrivatePostgres,
  startPrivateRedis,
  waitFor,
} from "./services.js";

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dist = (...parts: string[]) => join(REPO_ROOT, ...parts);
const NODE_AGENT_MAIN = dist("control-plane/dist/node-agent/main.js");
const MASTER_MAIN = dist("control-plane/dist/master/main.js");
const API_MASTER_MAIN = dist("control-plane/dist/api-master/main.js");

export interface ClusterOptions {
  /** Where state, logs and the private databases live (default `<repo>/.warren`). */
  readonly dataDir?: string;
  /** Node agents to start on this host (each with its own instance tag, state dir and address range). */
  readonly nodeAgents?: number;
  /** Use this PostgreSQL (else a private one under dataDir). */
  readonly databaseUrl?: string;
  /** Use this Redis (else a private one). */
  readonly redisUrl?: string;
  /** Fixed ports (default: free ports). */
  readonly apiPort?: number;
  readonly proxyPort?: number;
  /** The proxy's listen address (default 127.0.0.1; any 127.x.y.z works on Linux without configuration). */
  readonly proxyHost?: string;
  /** E2B_DOMAIN routing over TLS instead of plain HTTP (below). */
  readonly tls?: ClusterTls;
  /** Templates with a warm pool and pool size per node agent. */
  readonly poolSize?: number;
  /** Prefix of node agents' instance tags (netns, veth, cgroup and firewall names): `<prefix>a`, `<prefix>b`, ... */
  readonly instancePrefix?: string;
  /** Sandbox address range of node agent i (default `10.<201+i>.0.0/16`). */
  readonly nodeCidr?: (index: number) => string;
  /** Extra environment for every Warren process. */
  readonly env?: Readonly<Record<string, string>>;
  /** Templates every node agent must list as ready before the cluster is (default `base`; set to what it prebuilds). */
  readonly readyTemplates?: readonly string[];
  /**
   * Templates the node agents also make at their first start (with `readyTemplates`, in WARREN_PREBUILD_TEMPLATES
   * unless `env` sets it) that `start` does not wait for: each is announced through `onProgress` once every node
   * agent has it (`warren up`: `code-interpreter-v1`, minutes of the template builder on a first start).
   */
  readonly laterTemplates?: readonly string[];
  /** Prints progress lines. */
  readonly onProgress?: (line: string) => void;
  /** How long `stop` lets each process end after SIGTERM before SIGKILL (default 30 s). */
  readonly stopGraceMs?: number;
  /**
   * Route every proxy→sandbox connection through the node agents' relay (PROXY_RELAY=always, a fresh shared
   * WARREN_RELAY_TOKEN / PROXY_RELAY_TOKEN), as a proxy on another node must.
   */
  readonly relay?: boolean;
  /**
   * Run the api and the master as two processes talking over loopback HTTP (as on several hosts), instead of one
   * process where the api calls the master in-process (the default: a single control-plane host's layout).
   */
  readonly separateMaster?: boolean;
}

/**
 * E2B's own layout: the proxy serves `<port>-<id>.<domain>` and `api.<domain>` (forwarded to the api, PROXY_API_URL)
 * over HTTPS with a certificate for `*.<domain>`, and the master hands the domain (with `:<port>` unless the proxy
 * listens on 443) to clients, so the e2b SDK needs only E2B_DOMAIN and E2B_API_KEY.
 */
export interface ClusterTls {
  readonly domain: string;
  readonly certFile: string;
  readonly keyFile: string;
  /** PEM of the CA that signed certFile, when the machine does not trust it (a test CA); used by the readiness check. */
  readonly caFile?: string;
}

/** What a user (or a test) needs to talk to the cluster. */
export interface ClusterEnv {
  readonly E2B_API_URL: string;
  readonly E2B_SANDBOX_URL: string;
  readonly E2B_API_KEY: string;
  readonly WARREN_API_URL: string;
  readonly WARREN_PROXY_URL: string;
  readonly WARREN_API_KEY: string;
  readonly WARREN_ADMIN_TOKEN: string;
  /** With `tls`: the domain clients use (E2B_API_URL and E2B_SANDBOX_URL stay the direct endpoints). */
  readonly E2B_DOMAIN?: string;
  /** The volume content API (the api): the SDK's `Volume` does not read E2B_API_URL. */
  readonly E2B_VOLUME_API_URL: string;
}

/**
 * Warren on one machine: PostgreSQL and Redis (reused or private), the master and the api (one process unless
 * `separateMaster`), node agents and the proxy, each a process of its own, then a team and an API key. `stop()`
 * ends everything in reverse order; node agents kill their sandboxes on SIGTERM, so nothing is left behind.
 */
export class LocalCluster {
  readonly processes: ManagedChild[] = [];
  env!: ClusterEnv;
  readonly nodeAgentChildren: ManagedChild[] = [];
  databaseUrl = "";
  redisUrl = "";
  dbSchema = "";
  /** The master's Connect endpoint (node agents and the api call it; tests reach internal calls through it). */
  masterUrl = "";
  private readonly dataDir: string;
  private readonly logDir: string;
  private redisChild: ManagedChild | undefined;
  /** Set by `stop`: background watches end. */
  private stopping = false;
  private postgresChild: ManagedChild | undefined;
  private readonly agentEnv: NodeJS.ProcessEnv[] = [];
  /** The master's process: the master alone, or the api and the master together (`separateMaster` unset). */
  private master:
    | { child: ManagedChild; name: string; script: string; env: NodeJS.ProcessEnv; readyUrl: string }
    | undefined;

  constructor(private readonly options: ClusterOptions = {}) {
    this.dataDir = resolve(options.dataDir ?? join(REPO_ROOT, ".warren"));
    this.logDir = join(this.dataDir, "logs");
  }

  async start(): Promise<ClusterEnv> {
    const progress = this.options.onProgress ?? (() => undefined);
    mkdirSync(this.logDir, { recursive: true });
    try {
      await this.startDatabases(progress);
      const secrets = clusterSecrets(this.dataDir);
      const masterPort = await freePort();
      this.masterUrl = `http://127.0.0.1:${masterPort}`;
      const apiPort = this.options.apiPort ?? (await freePort());
      const proxyPort = this.options.proxyPort ?? (await freePort());
      const proxyHost = this.options.proxyHost ?? "127.0.0.1";
      const tls = this.options.tls;
      const clientDomain = tls && (proxyPort === 443 ? tls.domain : `${tls.domain}:${proxyPort}`);
      const relayToken = this.options.relay ? randomBytes(24).toString("hex") : undefined;
      const env = new ProcessEnv(this.options, {
        dataDir: this.dataDir,
        databaseUrl: this.databaseUrl,
        dbSchema: this.dbSchema,
        redisUrl: this.redisUrl,
        secrets,
        masterPort,
        apiPort,
        proxyHost,
        proxyPort,
        tls,
        clientDomain,
        relayToken,
      });

      const apiUrl = env.apiUrl;
      if (this.options.separateMaster) {
        progress("starting the master");
        const masterEnv = env.master();
        const master = this.spawn("master", MASTER_MAIN, masterEnv);
        const readyUrl = `http://127.0.0.1:${masterPort}/`;
        this.master = { child: master, name: "master", script: MASTER_MAIN, env: masterEnv, readyUrl };
        await waitForHttp(master, readyUrl, 30_000);

        progress("starting the api");
        const api = this.spawn("api", dist("control-plane/dist/api/main.js"), env.api());
        await waitForHttp(api, `${apiUrl}/health`, 30_000);
      } else {
        progress("starting the api and the master");
        const controlEnv = { ...env.master(), ...env.api() };
        const control = this.spawn("api-master", API_MASTER_MAIN, controlEnv);
        // The api starts once the master serves: its health answers when both do.
        const readyUrl = `${apiUrl}/health`;
        this.master = { child: control, name: "api-master", script: API_MASTER_MAIN, env: controlEnv, readyUrl };
        await waitForHttp(control, readyUrl, 60_000);
      }

      const agents = await this.startNodeAgents(env, progress);
      await this.waitForNodeAgents(agents, apiUrl, secrets.adminToken, progress);

      progress("starting the proxy");
      const proxy = this.spawn("proxy", dist("proxy/dist/main.js"), env.proxy());
      const proxyUrl = `${tls ? "https" : "http"}://${proxyHost}:${proxyPort}`;
      if (tls) await waitForTls(proxy, proxyHost, proxyPort, tls);
      else await waitForHttp(proxy, `${proxyUrl}/`, 30_000);

      progress("creating a team and an API key");
      const apiKey = await this.createTeam(apiUrl, secrets.adminToken);
      this.env = {
        E2B_API_URL: apiUrl,
        E2B_SANDBOX_URL: proxyUrl,
        E2B_API_KEY: apiKey,
        WARREN_API_URL: apiUrl,
        WARREN_PROXY_URL: proxyUrl,
        WARREN_API_KEY: apiKey,
        WARREN_ADMIN_TOKEN: secrets.adminToken,
        ...(clientDomain ? { E2B_DOMAIN: clientDomain } : {}),
        E2B_VOLUME_API_URL: apiUrl,
      };
      // After the cluster is ready: what it still makes is news to its user, not a step of the start.
      this.watchLaterTemplates(agents, progress);
      return this.env;
    } catch (error) {
      await this.stop();
      throw new Error(`${(error as Error).message}\n(logs in ${this.logDir})`);
    }
  }

  /** The PostgreSQL and Redis given in the options, or private ones under the data dir. */
  private async startDatabases(progress: (line: string) => void): Promise<void> {
    if (this.options.databaseUrl) {
      this.databaseUrl = this.options.databaseUrl;
    } else {
      progress("starting a private PostgreSQL");
      const pg = await startPrivatePostgres(join(this.dataDir, "postgres"), this.logDir);
      this.processes.push(pg.process);
      this.postgresChild = pg.process;
      this.databaseUrl = pg.url;
    }
    if (this.options.redisUrl) {
      this.redisUrl = this.options.redisUrl;
    } else {
      progress("starting a private Redis");
      const redis = await startPrivateRedis(this.logDir);
      this.processes.push(redis.process);
      this.redisChild = redis.process;
      this.redisUrl = redis.url;
    }
    // A shared PostgreSQL gets a schema of this cluster's own.
    this.dbSchema = this.options.databaseUrl ? `warren_${randomBytes(4).toString("hex")}` : "warren";
  }

  /** Starts the node agents (each with its own instance tag, state dir, address range and port); returns how many. */
  private async startNodeAgents(env: ProcessEnv, progress: (line: string) => void): Promise<number> {
    const agents = this.options.nodeAgents ?? 1;
    for (let i = 0; i < agents; i++) {
      const instance = `${this.options.instancePrefix ?? ""}${String.fromCharCode(97 + i)}`;
      const agentPort = await freePort();
      progress(`starting node agent ${instance} (a first start has the template builder make base: about two minutes)`);
      const agentEnv = env.nodeAgent(i, instance, agentPort);
      this.agentEnv.push(agentEnv);
      this.nodeAgentChildren.push(this.spawn(`node-agent-${instance}`, NODE_AGENT_MAIN, agentEnv));
    }
    return agents;
  }

  /**
   * Until every node agent heartbeats and lists the templates it prebuilds as ready: an agent heartbeats before its
   * first template build ends (on a fresh machine, about two minutes of the template builder).
   */
  private async waitForNodeAgents(
    agents: number,
    apiUrl: string,
    adminToken: string,
    progress: (line: string) => void,
  ): Promise<void> {
    progress("waiting for the node agents to report");
    await waitFor(
      `${agents} node agent(s) up`,
      async () => {
        for (const child of this.processes) assertRunning(child);
        const res = await fetch(`${apiUrl}/warren/v1/admin/nodes`, { headers: { "X-Admin-Token": adminToken } });
        const nodes = (await res.json()) as { status?: string; state?: string }[];
        const up = nodes.filter((n) => (n.status ?? n.state) === "up").length;
        return up >= agents ? true : undefined;
      },
      600_000,
    );
    const templates = this.options.readyTemplates ?? ["base"];
    const announced = new Set<string>();
    progress(
      `templates still building on the node agents: ${templates.join(", ")} (a first start has the template builder make them)`,
    );
    await waitFor(
      "node agents' templates",
      async () => {
        for (const child of this.processes) assertRunning(child);
        let all = true;
        for (const templateId of templates) {
          const ready = await this.redis.nodesWithTemplate(templateId);
          if (ready < agents) all = false;
          else if (!announced.has(templateId)) {
            announced.add(templateId);
            progress(`template ${templateId} ready on ${ready} node agent(s)`);
          }
        }
        return all ? true : undefined;
      },
      900_000,
    );
  }

  /**
   * Announces each of `laterTemplates` once every node agent lists it as ready (in the background; a stop ends the
   * watch). Those not ready yet are named at once, so a user knows what is still being made.
   */
  private watchLaterTemplates(agents: number, progress: (line: string) => void): void {
    const waiting = new Set(this.options.laterTemplates ?? []);
    if (waiting.size === 0) return;
    let first = true;
    const look = async () => {
      for (const templateId of [...waiting]) {
        const ready = await this.redis.nodesWithTemplate(templateId);
        if (ready < agents) continue;
        waiting.delete(templateId);
        if (!first) progress(`template ${templateId} ready on ${ready} node agent(s)`);
      }
      if (first && waiting.size > 0) {
        progress(`still being made by the template builder: ${[...waiting].join(", ")} (announced when ready)`);
      }
      first = false;
    };
    const watch = async () => {
      while (waiting.size > 0 && !this.stopping) {
        await look().catch(() => undefined);
        if (waiting.size > 0) await new Promise((resolve) => setTimeout(resolve, 1000).unref());
      }
    };
    void watch();
  }

  /** A team of this cluster's own with an API key (the key is returned). */
  private async createTeam(apiUrl: string, adminToken: string): Promise<string> {
    const res = await fetch(`${apiUrl}/warren/v1/admin/teams`, {
      method: "POST",
      headers: { "X-Admin-Token": adminToken, "Content-Type": "application/json" },
      body: JSON.stringify({ name: `local-${randomBytes(3).toString("hex")}` }),
    });
    if (res.status !== 201) throw new Error(`creating a team failed: ${res.status} ${await res.text()}`);
    const created = (await res.json()) as { apiKey: { key: string } };
    return created.apiKey.key;
  }

  /**
   * Stops every process, newest first: proxy, node agents (which remove their sandboxes), api, master, databases;
   * then unmounts the volumes' filesystems (their images stay: the next start mounts them again on first use).
   */
  async stop(): Promise<void> {
    this.stopping = true;
    for (const child of [...this.processes].reverse()) {
      const wasRunning = child.child.exitCode === null && child.child.signalCode === null;
      await child.stop("SIGTERM", this.options.stopGraceMs ?? 30_000);
      const index = this.nodeAgentChildren.indexOf(child);
      if (index >= 0 && wasRunning && child.child.signalCode === "SIGKILL") await this.sweepNodeAgent(index);
    }
    await unmountUnder(join(this.dataDir, "volumes"));
  }

  /**
   * A node agent that overran its stop's grace was SIGKILLed with sandboxes still up (a machine stalled for minutes
   * left a test's sandbox disk mounted under its data folder). Started once more it re-adopts them, and stopped
   * with a longer grace it kills them (`WARREN_KILL_ON_STOP`).
   */
  private async sweepNodeAgent(index: number): Promise<void> {
    const agent = this.startNodeAgent(index);
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline && agent.child.exitCode === null && agent.child.signalCode === null) {
      if (readFileSync(agent.logFile, "utf8").includes("node agent listening")) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    await agent.stop("SIGTERM", 120_000);
  }

  /** Fault injection: SIGKILL node agent `index` (its sandboxes keep running, as after a crash). */
  async killNodeAgent(index: number): Promise<void> {
    const agent = this.nodeAgentChildren[index];
    if (!agent) throw new Error(`no node agent ${index}`);
    await agent.stop("SIGKILL");
  }

  /** The node a sandbox's route names ("" when it has none, e.g. while paused on no node). */
  nodeOf(sandboxId: string): Promise<string> {
    return this.redis.nodeOf(sandboxId);
  }

  /** Cordons (`on`) or uncordons a node through the admin API; resolves with the answer's status. */
  async cordon(nodeId: string, on: boolean): Promise<number> {
    const res = await fetch(`${this.env.WARREN_API_URL}/warren/v1/admin/nodes/${nodeId}/cordon`, {
      method: on ? "POST" : "DELETE",
      headers: { "X-Admin-Token": this.env.WARREN_ADMIN_TOKEN },
    });
    await res.body?.cancel();
    return res.status;
  }

  /**
   * Fault injection: node agent `index` is gone for good: stopped (its sandboxes removed) and its state folder
   * (sandbox records, snapshots) deleted, as when a host dies.
   */
  async removeNodeAgent(index: number): Promise<void> {
    const agent = this.nodeAgentChildren[index];
    const env = this.agentEnv[index];
    if (!agent || !env) throw new Error(`no node agent ${index}`);
    await agent.stop("SIGTERM", 30_000);
    await rm(env.WARREN_STATE_DIR as string, { recursive: true, force: true });
  }

  /** Starts node agent `index` again with its original configuration (it re-adopts its sandboxes). */
  startNodeAgent(index: number): ManagedChild {
    const env = this.agentEnv[index];
    if (!env) throw new Error(`no node agent ${index}`);
    const agent = this.spawn(`node-agent-${env.WARREN_INSTANCE}-restarted`, NODE_AGENT_MAIN, env);
    this.nodeAgentChildren[index] = agent;
    return agent;
  }

  /**
   * Stops the master and starts it again on the same port: SIGTERM as a rolling upgrade of a one-replica master
   * does (it hands the template builds it runs over), SIGKILL as a crash (fault injection: it hands nothing over).
   * Without `separateMaster` the api goes down and comes back with it.
   */
  async restartMaster(signal: "SIGTERM" | "SIGKILL" = "SIGTERM"): Promise<void> {
    const master = this.master;
    if (!master) throw new Error("the cluster has no master");
    await master.child.stop(signal, 30_000);
    const next = this.spawn(`${master.name}-restarted`, master.script, master.env);
    // In the old one's place, so `stop()` still ends the processes in their order.
    this.processes.pop();
    this.replace(master.child, next);
    this.master = { ...master, child: next };
    await waitForHttp(next, master.readyUrl, 30_000);
  }

  /** Fault injection: restarts the private Redis on the same port (it keeps nothing, as configured). */
  async restartRedis(): Promise<void> {
    if (!this.redisChild) throw new Error("the cluster does not own its Redis");
    await this.redisChild.stop();
    const port = Number(new URL(this.redisUrl).port);
    const redis = await startPrivateRedis(this.logDir, port);
    this.replace(this.redisChild, redis.process);
    this.redisChild = redis.process;
  }

  /** Fault injection: restarts the private PostgreSQL on the same port (data kept). */
  async restartPostgres(): Promise<void> {
    if (!this.postgresChild) throw new Error("the cluster does not own its PostgreSQL");
    // A fast shutdown (SIGINT, `pg_ctl restart`'s default mode): clients are disconnected and the server stops
    // cleanly. SIGTERM's smart shutdown waits for every client to leave, which a master's sessions (its liveness
    // lock) never do: the stop then ran into its grace period and a SIGKILL, and the start into crash recovery.
    await this.postgresChild.stop("SIGINT");
    const port = Number(new URL(this.databaseUrl).port);
    const pg = await startPrivatePostgres(join(this.dataDir, "postgres"), this.logDir, port);
    this.replace(this.postgresChild, pg.process);
    this.postgresChild = pg.process;
  }

  private replace(old: ManagedChild, next: ManagedChild): void {
    const at = this.processes.indexOf(old);
    if (at >= 0) this.processes[at] = next;
  }

  /** Writes the environment as KEY=value lines (the file `warren up` leaves for users and scripts). */
  writeEnvFile(path = join(this.dataDir, "env")): string {
    const lines = Object.entries(this.env).map(([key, value]) => `${key}=${value}`);
    writeFileSync(path, `${lines.join("\n")}\n`, { mode: 0o600 });
    return path;
  }

  /** The cluster's Redis, read directly (its URL is fixed once the databases are up, also across restarts). */
  private get redis(): ClusterRedis {
    return new ClusterRedis(this.redisUrl, this.options.env?.WARREN_REDIS_PREFIX);
  }

  private spawn(name: string, script: string, env: NodeJS.ProcessEnv): ManagedChild {
    if (!existsSync(script)) throw new Error(`${script} is missing: run \`npm run build\` first`);
    const child = startChild(name, process.execPath, [script], { env, logDir: this.logDir, cwd: REPO_ROOT });
    this.processes.push(child);
    return child;
  }
}
