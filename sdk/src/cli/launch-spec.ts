import { join } from "node:path";

/** What `warren up` asks the launcher for (passed as JSON in the WARREN_LAUNCH environment variable). */
export interface LaunchSpec {
  readonly dataDir: string;
  readonly apiPort?: number;
  readonly proxyPort?: number;
  readonly nodeAgents?: number;
  readonly poolSize?: number;
  readonly instancePrefix?: string;
  /** Address range of node agent i (the last one repeats). */
  readonly nodeCidrs?: readonly string[];
  readonly databaseUrl?: string;
  readonly redisUrl?: string;
  /** E2B's domain layout over TLS (`<port>-<id>.<domain>`, `api.<domain>`); absolute paths of PEM files. */
  readonly tls?: {
    readonly domain: string;
    readonly certFile: string;
    readonly keyFile: string;
    readonly caFile?: string;
  };
}

/** Messages from the launcher to `warren up`. */
export type LaunchMessage =
  | { readonly type: "progress"; readonly line: string }
  | { readonly type: "ready"; readonly env: Record<string, string>; readonly envFile: string }
  | { readonly type: "failed"; readonly error: string };

/** The launcher's pid, while it runs (`warren down` signals it). */
export const pidFileOf = (dataDir: string) => join(dataDir, "warren.pid");
/** The launcher's own log (its progress lines); the cluster's processes log next to it. */
export const launcherLogOf = (dataDir: string) => join(dataDir, "logs", "launcher.log");
