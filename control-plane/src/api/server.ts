import http from "node:http";
import type { AddressInfo } from "node:net";
import { createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { createLogger, type Logger } from "@warren/platform/log";
import { MasterService } from "@warren/proto/master/v1/master_pb";
import { CachedApiKeyIdentities } from "../store/api-key-cache.js";
import { createDb, type Db } from "../store/db.js";
import { migrate } from "../store/migrations.js";
import { rewrapSecrets } from "../store/secrets.js";
import { createApp } from "./app.js";
import type { ApiConfig } from "./config.js";
import { ApiMetrics } from "./metrics.js";

export interface ApiServerOptions {
  readonly config: ApiConfig;
  readonly log?: Logger;
  readonly ssePollMs?: number;
  /** How to reach the master when it runs in this process (`api-master`); otherwise Connect over HTTP to masterUrl. */
  readonly masterTransport?: Transport;
}

/**
 * One stateless api replica. It applies migrations too (idempotent, under an advisory lock), so the api and the
 * master can start in any order.
 */
export class ApiServer {
  private constructor(
    private readonly server: http.Server,
    readonly db: Db,
    private readonly config: ApiConfig,
    private readonly streams: Set<() => void>,
    private readonly identities: CachedApiKeyIdentities | undefined,
  ) {}

  static async start(options: ApiServerOptions): Promise<ApiServer> {
    const { config } = options;
    const log = options.log ?? createLogger("api");
    const db = createDb({ url: config.databaseUrl, schema: config.schema });
    await migrate(db, config.schema);
    if (config.secretKeys) {
      const moved = await rewrapSecrets(db, config.secretKeys);
      if (moved > 0)
        log.info("secrets re-sealed with the newest key", { count: moved, keyId: config.secretKeys.currentKeyId });
    }
    const master = createClient(
      MasterService,
      options.masterTransport ??
        // Binary protobuf: the control plane's own calls need no readable bodies, and JSON's encoding cost ~ms per call.
        createConnectTransport({ baseUrl: config.masterUrl, httpVersion: "1.1", useBinaryFormat: true }),
    );
    const streams = new Set<() => void>();
    const identities =
      config.apiKeyCacheMs > 0
        ? new CachedApiKeyIdentities({
            db,
            databaseUrl: config.databaseUrl,
            schema: config.schema,
            ttlMs: config.apiKeyCacheMs,
            onError: (error) =>
              log.warn("listening for team and key changes failed: keys are looked up per request until it works", {
                error: error.message,
              }),
          }).start()
        : undefined;
    const app = createApp({
      db,
      ...(identities ? { identities } : {}),
      master,
      metrics: new ApiMetrics(),
      log,
      adminToken: config.adminToken,
      internalToken: config.internalToken,
      secretKeys: config.secretKeys,
      maxUploadBytes: config.maxTemplateUploadBytes,
      maxActiveBuildsPerTeam: config.maxActiveBuildsPerTeam,
      ...(config.ecrEndpoint ? { ecrEndpoint: config.ecrEndpoint } : {}),
      volumes: config.volumesDir
        ? { dir: config.volumesDir, quotaBytes: config.volumeQuotaMB * 2 ** 20, images: config.volumeImages }
        : null,
      artifacts: config.artifacts,
      streams,
      console: config.console,
      ...(options.ssePollMs ? { ssePollMs: options.ssePollMs } : {}),
    });
    const server = http.createServer(app);
    server.keepAliveTimeout = 65_000;
    await new Promise<void>((resolve) => server.listen(config.port, config.host, resolve));
    const api = new ApiServer(server, db, config, streams, identities);
    log.info("api listening", { url: api.url });
    return api;
  }

  get url(): string {
    const address = this.server.address() as AddressInfo;
    return `http://${this.config.host}:${address.port}`;
  }

  /** Graceful stop: refuse new connections, end SSE followers, let in-flight requests finish, close the pool. */
  async stop(drainMs = 10_000): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const close of [...this.streams]) close();
    // Keep-alive sockets become idle as their last response ends; close each as soon as it does, and cut
    // whatever is still open when the drain time is over.
    const sweep = setInterval(() => this.server.closeIdleConnections(), 50);
    const deadline = setTimeout(() => this.server.closeAllConnections(), drainMs);
    this.server.closeIdleConnections();
    try {
      await closed;
    } finally {
      clearInterval(sweep);
      clearTimeout(deadline);
    }
    await this.identities?.stop();
    await this.db.end().catch(() => undefined);
  }
}
