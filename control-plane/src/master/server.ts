import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { type ConnectRouter, createRouterTransport, type Interceptor, type Transport } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Redis } from "ioredis";
import { createDb, type Db } from "../store/db.js";
import { migrate } from "../store/migrations.js";
import { cordonedNodeIds } from "../store/nodes.js";
import { Listener } from "../store/notify.js";
import type { MasterConfig } from "./config.js";
import { CrashWatch } from "./crash-watch.js";
import { Durability } from "./durability.js";
import { evictExpired } from "./evictor.js";
import { ExecPolicies } from "./exec-policies.js";
import { connectKubernetes } from "./kubernetes/api.js";
import { KubernetesNodeView } from "./kubernetes/cluster-view.js";
import { NodeDrainer } from "./kubernetes/drain.js";
import { LeaseElection, type LeaseElectionOptions } from "./kubernetes/lease-election.js";
import { LeaderElection, type Leadership } from "./leader.js";
import { SandboxLifecycle } from "./lifecycle.js";
import { MasterLiveness } from "./liveness.js";
import { createLogger, type Logger } from "./log.js";
import { MasterMetrics } from "./metrics.js";
import { SandboxMetricsSampler } from "./metrics-sampler.js";
import type { NodeAgentConnector } from "./node-agent-client.js";
import { NodeRegistry } from "./node-registry.js";
import { reconcile } from "./reconciler.js";
import { SandboxExport } from "./sandbox-export.js";
import { masterRoutes } from "./service.js";
import { SnapshotService } from "./snapshots.js";
import { ShippedTemplateBuilds } from "./templates/shipped-builds.js";
import { TemplateBuilder } from "./templates/template-builder.js";
import { TokenIssuer } from "./tokens.js";

/** How often the leader looks at what shipped templates nodes await from the template builder. */
const SHIPPED_BUILDS_PASS_MS = 2000;

export interface MasterOptions {
  readonly config: MasterConfig;
  readonly nodeAgent: NodeAgentConnector;
  readonly log?: Logger;
}

/** A master replica: serves MasterService always; runs the evictor and reconciler only while leader. */
export class Master {
  readonly lifecycle: SandboxLifecycle;
  readonly snapshots: SnapshotService;
  private readonly durability: Durability;
  readonly registry: NodeRegistry;
  readonly metrics: SandboxMetricsSampler;
  readonly builder: TemplateBuilder;
  private readonly shippedBuilds: ShippedTemplateBuilds;
  readonly execPolicies: ExecPolicies;
  private readonly crashWatch: CrashWatch;
  private readonly loops: NodeJS.Timeout[] = [];
  private readonly leader: Leadership;
  /** Set in Kubernetes mode: pauses the sandboxes of draining nodes (leader only). */
  private readonly drainer: NodeDrainer | undefined;
  private server: http.Server | undefined;
  /** MasterService's routes and interceptors, as served on `server` (and in-process: `inProcessTransport`). */
  private service: { routes: (router: ConnectRouter) => void; interceptors: Interceptor[] } | undefined;
  private leaderTasks = new Set<Promise<unknown>>();
  /** The leader's LISTEN for nudges from every replica. */
  private nudges: Listener | undefined;
  /** Bumped on demotion so loops of an earlier term stop rescheduling. */
  private generation = 0;

  private constructor(
    readonly config: MasterConfig,
    readonly db: Db,
    readonly redis: Redis,
    private readonly nodeAgent: NodeAgentConnector,
    private readonly log: Logger,
    private readonly liveness: MasterLiveness,
    private readonly kubernetes?: {
      readonly view: KubernetesNodeView;
      readonly leader: Omit<LeaseElectionOptions, "onElected" | "onDemoted">;
    },
  ) {
    this.registry = new NodeRegistry(redis, kubernetes?.view, () => cordonedNodeIds(db));
    this.metrics = new SandboxMetricsSampler({
      db,
      registry: this.registry,
      nodeAgent,
      tokens: new TokenIssuer(config.tokenSecret),
    });
    this.lifecycle = new SandboxLifecycle({
      db,
      redis,
      registry: this.registry,
      nodeAgent,
      tokens: new TokenIssuer(config.tokenSecret),
      log,
      config: {
        domain: config.domain,
        placementAttempts: config.placementAttempts,
        memoryOvercommit: config.memoryOvercommit,
        replayWaitMs: 60_000,
        templateWaitMs: config.templateWaitMs,
      },
    });
    this.durability = new Durability({
      db,
      registry: this.registry,
      nodeAgent,
      tokens: new TokenIssuer(config.tokenSecret),
      log,
      memoryOvercommit: config.memoryOvercommit,
    });
    this.snapshots = new SnapshotService({
      db,
      registry: this.registry,
      nodeAgent,
      lifecycle: this.lifecycle,
      log,
      storeLayerGraceMs: config.storeLayerGraceMs,
    });
    this.execPolicies = new ExecPolicies(db, redis, log);
    this.crashWatch = new CrashWatch({
      db,
      registry: this.registry,
      lifecycle: this.lifecycle,
      log,
      redisUrl: config.redisUrl,
      keyPrefix: config.redisKeyPrefix,
    });
    this.builder = new TemplateBuilder({
      db,
      registry: this.registry,
      nodeAgent,
      tokens: new TokenIssuer(config.tokenSecret),
      log: log.child({ part: "templates" }),
      config: config.builds,
      memoryOvercommit: config.memoryOvercommit,
      masterLock: this.liveness.key,
    });
    this.shippedBuilds = new ShippedTemplateBuilds({
      db,
      registry: this.registry,
      nodeAgent,
      builder: this.builder,
      log: log.child({ part: "shipped-templates" }),
    });
    const onElected = () => this.startLeaderLoops();
    const onDemoted = () => this.stopLeaderLoops();
    // In Kubernetes the Lease elects the leader; elsewhere the PostgreSQL advisory lock does.
    this.leader = kubernetes
      ? new LeaseElection({ ...kubernetes.leader, onElected, onDemoted })
      : new LeaderElection({
          url: config.databaseUrl,
          schema: config.schema,
          intervalMs: config.leaderIntervalMs,
          log,
          onElected,
          onDemoted,
        });
    this.drainer = kubernetes ? new NodeDrainer(db, this.registry, this.lifecycle, log) : undefined;
  }

  static async start(options: MasterOptions): Promise<Master> {
    const { config } = options;
    const log = options.log ?? createLogger("master");
    const db = createDb({
      url: config.databaseUrl,
      schema: config.schema,
      max: 20,
      synchronousCommit: config.synchronousCommit,
    });
    const applied = await migrate(db, config.schema);
    if (applied.length > 0) log.info("migrations applied", { versions: applied });
    const liveness = new MasterLiveness({ url: config.databaseUrl, retryMs: config.leaderIntervalMs, log });
    await liveness.start().catch(async (error) => {
      await db.end().catch(() => undefined);
      throw error;
    });
    const redis = new Redis(config.redisUrl, { maxRetriesPerRequest: 3, keyPrefix: config.redisKeyPrefix });
    redis.on("error", () => undefined);
    const kubernetes = config.kubernetes
      ? await Master.startKubernetes(config, log).catch(async (error) => {
          redis.disconnect();
          await liveness.stop();
          await db.end().catch(() => undefined);
          throw error;
        })
      : undefined;
    const master = new Master(config, db, redis, options.nodeAgent, log, liveness, kubernetes);
    const metrics = new MasterMetrics(db, () => master.isLeader);
    master.service = {
      routes: masterRoutes(
        master.lifecycle,
        master.metrics,
        master.snapshots,
        master.builder,
        new SandboxExport({ db, registry: master.registry, nodeAgent: options.nodeAgent, lifecycle: master.lifecycle }),
        master.execPolicies,
      ),
      interceptors: [metrics.interceptor(log)],
    };
    const handler = connectNodeAdapter(master.service);
    const server = http.createServer((req, res) => {
      if (req.method === "GET" && req.url === "/metrics") {
        metrics.registry.metrics().then(
          (text) => {
            res.writeHead(200, { "Content-Type": metrics.registry.contentType }).end(text);
          },
          () => res.writeHead(500).end(),
        );
        return;
      }
      handler(req, res);
    });
    await new Promise<void>((resolve) => server.listen(config.port, config.host, resolve));
    master.server = server;
    master.leader.start();
    log.info("master listening", { url: master.url });
    return master;
  }

  /**
   * MasterService called in this process (an api started beside the master: `control-plane/src/api-master`): the
   * same routes and interceptors as over HTTP, minus the loopback round trip each way.
   */
  inProcessTransport(): Transport {
    if (!this.service) throw new Error("the master is not serving yet");
    return createRouterTransport(this.service.routes, { router: { interceptors: this.service.interceptors } });
  }

  /** Kubernetes mode: the pod and Node view (listed before the master serves) and the Lease's settings. */
  private static async startKubernetes(config: MasterConfig, log: Logger) {
    const k8s = config.kubernetes as NonNullable<MasterConfig["kubernetes"]>;
    const api = connectKubernetes(k8s);
    const view = new KubernetesNodeView(api, k8s, log);
    await view.start();
    log.info("kubernetes integration on", { mode: k8s.mode, namespace: k8s.namespace, lease: k8s.leaseName });
    const leader: Omit<LeaseElectionOptions, "onElected" | "onDemoted"> = {
      api,
      namespace: k8s.namespace,
      name: k8s.leaseName,
      // Unique per process: a restarted replica must not mistake its predecessor's Lease for its own.
      identity: `${k8s.identity}_${randomBytes(4).toString("hex")}`,
      leaseSeconds: k8s.leaseSeconds,
      retryMs: config.leaderIntervalMs,
      log,
    };
    return { view, leader };
  }

  get url(): string {
    const address = this.server?.address() as AddressInfo | null;
    return `http://${this.config.host}:${address?.port ?? this.config.port}`;
  }

  get isLeader(): boolean {
    return this.leader.isLeader;
  }

  private startLeaderLoops(): void {
    const drainer = this.drainer;
    if (drainer) this.every(this.config.reconcileIntervalMs, () => drainer.pass());
    this.crashWatch.start();
    this.every(this.config.evictIntervalMs, () => evictExpired(this.db, this.lifecycle, this.log));
    if (this.config.metricsIntervalMs > 0) this.every(this.config.metricsIntervalMs, () => this.metrics.recordAll());
    this.every(this.config.reconcileIntervalMs, () =>
      reconcile(this.db, this.registry, this.nodeAgent, this.lifecycle, this.log, {
        startTimeoutMs: this.config.startTimeoutMs,
        nodeDownAfterMs: this.config.nodeDownAfterMs,
      }),
    );
    this.every(this.config.reconcileIntervalMs, () => this.snapshots.sweepNodes());
    const durabilityNow = this.every(this.config.durabilityIntervalMs, () => this.durability.pass());
    // A pause on any replica nudges the pass (store/notify.ts): durable in seconds, not a reconcile interval later.
    this.nudges = new Listener({
      url: this.config.databaseUrl,
      schema: this.config.schema,
      topic: "durability",
      onNotify: durabilityNow,
      onError: (error) => this.log.warn("listening for durability nudges failed; retrying", { error: error.message }),
    });
    this.nudges.start();
    this.every(this.config.storeGcIntervalMs, () => this.snapshots.collectStore());
    this.every(this.config.reconcileIntervalMs, () => this.builder.recoverAbandoned());
    // Each pass only starts runs (a build takes minutes): the next pass sees what nodes still await.
    this.every(SHIPPED_BUILDS_PASS_MS, () => this.shippedBuilds.pass());
    this.every(this.config.reconcileIntervalMs, () => this.execPolicies.syncAll());
  }

  /**
   * Runs `task` repeatedly, never overlapping itself. The function it returns runs it now instead of at its next
   * turn (or once more right after a run in progress).
   */
  private every(intervalMs: number, task: () => Promise<unknown>): () => void {
    const slot = this.loops.length;
    const generation = this.generation;
    let running = false;
    let again = false;
    const run = () => {
      running = true;
      again = false;
      const pending = task()
        .catch((error) => this.log.warn("leader task failed", { error }))
        .finally(() => {
          running = false;
          this.leaderTasks.delete(pending);
          if (this.generation === generation) this.loops[slot] = setTimeout(run, again ? 0 : intervalMs);
        });
      this.leaderTasks.add(pending);
    };
    this.loops.push(setTimeout(run, 0));
    return () => {
      if (this.generation !== generation) return;
      if (running) {
        again = true;
        return;
      }
      clearTimeout(this.loops[slot]);
      this.loops[slot] = setTimeout(run, 0);
    };
  }

  private stopLeaderLoops(): void {
    this.generation++;
    void this.nudges?.stop();
    this.nudges = undefined;
    this.crashWatch.stop();
    for (const timer of this.loops) clearTimeout(timer);
    this.loops.length = 0;
  }

  /** Graceful stop: no new RPCs, in-flight ones and leader tasks drain, then connections close. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    const closed = server ? new Promise<void>((resolve) => server.close(() => resolve())) : Promise.resolve();
    // Keep-alive sockets from the api become idle once their RPC ends: close each then; cut the rest after 10 s.
    const sweep = setInterval(() => server?.closeIdleConnections(), 50);
    const deadline = setTimeout(() => server?.closeAllConnections(), 10_000);
    server?.closeIdleConnections();
    await this.builder.stop();
    // After the hand-over: a build still running here past its deadline is continued elsewhere at once.
    await this.liveness.stop();
    await this.leader.stop();
    this.crashWatch.stop();
    await this.kubernetes?.view.stop();
    // Leader tasks end on their own (node calls have timeouts); do not let one hold the shutdown long.
    await Promise.race([
      Promise.allSettled([...this.leaderTasks]),
      new Promise((resolve) => setTimeout(resolve, 5_000).unref()),
    ]);
    await closed;
    clearInterval(sweep);
    clearTimeout(deadline);
    await this.db.end().catch(() => undefined);
    this.redis.disconnect();
  }
}
