import { join } from "node:path";
import type { ClusterOptions, ClusterTls } from "./cluster.js";
import type { ClusterSecrets } from "./secrets.js";

/** Where the cluster's processes find each other and what they share, decided before any of them starts. */
export interface ClusterLayout {
  readonly dataDir: string;
  readonly databaseUrl: string;
  readonly dbSchema: string;
  readonly redisUrl: string;
  readonly secrets: ClusterSecrets;
  readonly masterPort: number;
  readonly apiPort: number;
  readonly proxyHost: string;
  readonly proxyPort: number;
  readonly tls: ClusterTls | undefined;
  /** With `tls`: the domain clients use (`<domain>:<port>` unless the proxy listens on 443). */
  readonly clientDomain: string | undefined;
  /** A fresh shared relay token when every proxy→sandbox connection goes through the node agents' relay. */
  readonly relayToken: string | undefined;
}

/**
 * Each Warren process's environment as the local cluster configures it: what every process shares (databases,
 * Redis, the volume and artifact folders), then each one's own settings, then the caller's `env` over all of it.
 * Pure: the only place the cluster's settings become variables.
 */
export class ProcessEnv {
  readonly common: NodeJS.ProcessEnv;

  constructor(
    private readonly options: ClusterOptions,
    private readonly layout: ClusterLayout,
  ) {
    this.common = {
      ...process.env,
      WARREN_DATABASE_URL: layout.databaseUrl,
      WARREN_DB_SCHEMA: layout.dbSchema,
      WARREN_REDIS_URL: layout.redisUrl,
      // Team volumes: a folder the api and every node agent share (one host here; NFS or alike across hosts). One
      // host: each volume is a filesystem of its quota's size, so the quota binds sandboxes' writes too.
      WARREN_VOLUMES_DIR: join(layout.dataDir, "volumes"),
      WARREN_VOLUME_IMAGES: "1",
      WARREN_ARTIFACTS_DIR: join(layout.dataDir, "artifacts"),
      ...options.env,
    };
  }

  get apiUrl(): string {
    return `http://127.0.0.1:${this.layout.apiPort}`;
  }

  master(): NodeJS.ProcessEnv {
    const { secrets, masterPort, clientDomain } = this.layout;
    return {
      ...this.common,
      WARREN_TOKEN_SECRET: secrets.tokenSecret,
      WARREN_MASTER_HOST: "127.0.0.1",
      WARREN_MASTER_PORT: String(masterPort),
      ...(clientDomain ? { E2B_DOMAIN: clientDomain } : {}),
    };
  }

  api(): NodeJS.ProcessEnv {
    const { secrets, masterPort, apiPort, tls, proxyHost, proxyPort } = this.layout;
    return {
      ...this.common,
      WARREN_API_HOST: "127.0.0.1",
      WARREN_API_PORT: String(apiPort),
      WARREN_MASTER_URL: `http://127.0.0.1:${masterPort}`,
      WARREN_ADMIN_TOKEN: secrets.adminToken,
      WARREN_INTERNAL_TOKEN: secrets.internalToken,
      // The web console reaches sandbox ports through the proxy's host routing (Chromium and Firefox resolve
      // every *.localhost name to loopback themselves); with a domain, the console derives it from api.<domain>.
      ...(tls || proxyHost !== "127.0.0.1"
        ? {}
        : { WARREN_CONSOLE_SANDBOX_URL: `http://{port}-{sandboxID}.localhost:${proxyPort}` }),
      ...this.options.env,
    };
  }

  /** Node agent `index` (instance tag `instance`): its own state dir, address range and port. */
  nodeAgent(index: number, instance: string, port: number): NodeJS.ProcessEnv {
    const { dataDir, redisUrl, relayToken } = this.layout;
    return {
      ...this.common,
      WARREN_NODE_ID: `node-${instance}`,
      WARREN_INSTANCE: instance,
      WARREN_AGENT_LISTEN: `127.0.0.1:${port}`,
      WARREN_REDIS_URL: redisUrl,
      WARREN_STATE_DIR: join(dataDir, `agent-${instance}`),
      WARREN_NET_CIDR: this.options.nodeCidr?.(index) ?? `10.${201 + index}.0.0/16`,
      // The caller's env may size the pool too (a benchmark's `--env WARREN_POOL_SIZE=…`); `poolSize` otherwise.
      WARREN_POOL_SIZE: this.options.env?.WARREN_POOL_SIZE ?? String(this.options.poolSize ?? 2),
      WARREN_KILL_ON_STOP: "1",
      ...(this.options.laterTemplates?.length && !this.options.env?.WARREN_PREBUILD_TEMPLATES
        ? {
            WARREN_PREBUILD_TEMPLATES: [
              ...(this.options.readyTemplates ?? ["base"]),
              ...this.options.laterTemplates,
            ].join(","),
          }
        : {}),
      ...(relayToken ? { WARREN_RELAY_TOKEN: relayToken } : {}),
      // The cluster's template store: a directory its agents share, unless the caller names one (a registry).
      WARREN_STORE: this.options.env?.WARREN_STORE ?? `oci:${join(dataDir, "store")}`,
    };
  }

  proxy(): NodeJS.ProcessEnv {
    const { tls, proxyHost, proxyPort, redisUrl, secrets, relayToken } = this.layout;
    return {
      ...this.common,
      PROXY_HOST: proxyHost,
      PROXY_PORT: String(proxyPort),
      ...(tls
        ? {
            PROXY_TLS_CERT_FILE: tls.certFile,
            PROXY_TLS_KEY_FILE: tls.keyFile,
            PROXY_DOMAINS: tls.domain,
            PROXY_API_URL: this.apiUrl,
          }
        : {}),
      WARREN_REDIS_URL: redisUrl,
      PROXY_METRICS_PORT: "off",
      // Auto-resume: the proxy asks the api (internal endpoint) to resume a paused sandbox on traffic.
      PROXY_RESUME_URL: this.apiUrl,
      WARREN_INTERNAL_TOKEN: secrets.internalToken,
      ...(relayToken ? { PROXY_RELAY: "always", PROXY_RELAY_TOKEN: relayToken } : {}),
      ...this.options.env,
    };
  }
}
