import { existsSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { RuntimeDriver } from "../runtime/driver.js";
import { envdLauncherPath, useToolSpawner } from "../runtime/exec.js";
import type { HeldFileLock } from "../runtime/file-lock.js";
import { sandboxLogCap } from "../runtime/log-cap.js";
import { NamespaceDriver } from "../runtime/namespace/driver.js";
import { TemplateStore } from "../templates/store.js";
import { NodeAgent } from "./agent.js";
import type { NodeAgentConfig } from "./config.js";
import { claimInstance } from "./instance-claim.js";
import type { Logger } from "./log.js";
import { SandboxRelay } from "./relay.js";
import { RoutePublisher } from "./routes.js";
import { nodeAgentRoutes } from "./service.js";
import { ShippedFromBuilder } from "./shipped-from-builder.js";
import { StoreSharedTemplates } from "./shipped-templates.js";

export interface RunningNodeAgent<D extends RuntimeDriver = NamespaceDriver> {
  readonly agent: NodeAgent;
  readonly driver: D;
  readonly templates: TemplateStore;
  readonly server: Server;
  /** The port the Connect service listens on (useful when configured as 0). */
  readonly port: number;
  /** Stops serving, stops pools and heartbeats; sandboxes keep running unless killAll. */
  stop(options?: { killAll?: boolean }): Promise<void>;
}

/**
 * Wires config → driver, template store, Redis, agent and the Connect server, and starts them. The driver is the
 * namespace driver unless one is given (main.ts passes the microvm driver when the capability probe chose it).
 */
export async function startNodeAgent(config: NodeAgentConfig, log: Logger): Promise<RunningNodeAgent>;
export async function startNodeAgent<D extends RuntimeDriver>(
  config: NodeAgentConfig,
  log: Logger,
  runtime: D,
): Promise<RunningNodeAgent<D>>;
export async function startNodeAgent(
  config: NodeAgentConfig,
  log: Logger,
  runtime?: RuntimeDriver,
): Promise<RunningNodeAgent<RuntimeDriver>> {
  const claim = await claimInstance(config.instance);
  const releaseTools = toolSpawnerFor(config, log);
  try {
    const running = await startClaimed(config, log, runtime, claim);
    const stop = running.stop.bind(running);
    return {
      ...running,
      async stop(options) {
        try {
          await stop(options);
        } finally {
          releaseTools();
        }
      },
    };
  } catch (error) {
    releaseTools();
    await claim.release();
    throw error;
  }
}

/** Host tools forked by envd's `warren-exec --serve` (runtime/exec.ts) when it is built and not turned off. */
function toolSpawnerFor(config: NodeAgentConfig, log: Logger): () => void {
  const launcher = envdLauncherPath(config.envdRoot);
  if (!config.toolSpawner || !existsSync(launcher)) return () => undefined;
  return useToolSpawner(launcher, log.child({ part: "tools" }));
}

async function startClaimed(
  config: NodeAgentConfig,
  log: Logger,
  runtime: RuntimeDriver | undefined,
  claim: HeldFileLock,
): Promise<RunningNodeAgent<RuntimeDriver>> {
  let driver = runtime;
  driver ??= new NamespaceDriver({
    stateDir: config.stateDir,
    instance: config.instance,
    netCidr: config.netCidr,
    netPoolSize: config.netPoolSize,
    uidBase: config.uidBase,
    nodeBinary: config.nodeBinary,
    envdRoot: config.envdRoot,
    readyTimeoutMs: config.readyTimeoutMs,
    logCap: sandboxLogCap(config.sandboxLogMaxBytes),
    log: log.child({ part: "driver" }),
    ...(config.criu ? { criu: config.criu } : {}),
    ...(config.dnsUpstream ? { dnsUpstream: config.dnsUpstream } : {}),
    uplinkForwarding: config.uplinkForwarding,
    diskOvercommit: config.diskOvercommit,
  });
  const shared = config.shareShippedTemplates
    ? new StoreSharedTemplates({
        store: config.store,
        workDir: join(config.stateDir, "store-work"),
        redisUrl: config.redisUrl,
        redisPrefix: config.redisPrefix,
        nodeId: config.nodeId,
      })
    : undefined;
  // The shipped templates come from the master's template builder, on nodes whose driver can take a build's layers
  // as a rootfs (the namespace driver); others pull a copy (sharing) or use one this host's agents made. Late-bound:
  // its `scratch` is the agent's, which needs the template store first.
  let agentRef: NodeAgent | undefined;
  const shipped = driver.flattenSnapshot
    ? new ShippedFromBuilder(driver, () => (agentRef as NodeAgent).ensureTemplate("scratch"))
    : undefined;
  const templates = new TemplateStore({
    dir: config.templatesDir,
    ...(shipped ? { fromBuilder: shipped.build } : {}),
    uidBase: config.uidBase,
    ...(shared ? { shared } : {}),
    log: log.child({ part: "templates" }),
  });
  const routes = new RoutePublisher(config.redisUrl, config.redisPrefix);
  // Listen first, so a configured port 0 becomes the real port in the address the agent advertises.
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(config.listenPort, config.listenHost, () => resolve());
  });
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : config.listenPort;
  const nodeAddr = config.nodeAddr.endsWith(":0") ? `${config.nodeAddr.slice(0, -2)}:${port}` : config.nodeAddr;
  const agent = new NodeAgent({ ...config, nodeAddr }, driver, templates, routes, log, shipped);
  agentRef = agent;
  server.on(
    "request",
    connectNodeAdapter({
      routes: nodeAgentRoutes(agent, log),
      // No gzip: a snapshot's stream (ExportSnapshot) is mostly incompressible, and gzipping it cost the source
      // ~40 ms of CPU per MiB (117 MiB moved in 4.8 s instead of 1.0 s); the cluster's network outruns it.
      acceptCompression: [],
    }),
  );
  const relay = new SandboxRelay({ token: config.relayToken, sandboxes: agent, log: log.child({ part: "relay" }) });
  relay.attach(server);
  try {
    await agent.start();
  } catch (error) {
    server.close();
    await shared?.close();
    throw error;
  }
  if (driver instanceof NamespaceDriver) driver.startPools();
  log.info("node agent listening", { host: config.listenHost, port, nodeId: config.nodeId, driver: driver.name });
  return {
    agent,
    driver,
    templates,
    server,
    port,
    async stop(options = {}) {
      // Stop accepting; let in-flight calls (a create takes well under a second) finish, then cut the rest.
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      relay.close();
      server.closeIdleConnections();
      const deadline = setTimeout(() => server.closeAllConnections(), 10_000);
      await closed;
      clearTimeout(deadline);
      await agent.close(options);
      await shared?.close();
      await claim.release();
    },
  };
}
