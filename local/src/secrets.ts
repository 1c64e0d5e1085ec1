import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export interface ClusterSecrets {
  /** Signs sandbox access and traffic tokens (the master). */
  readonly tokenSecret: string;
  /** The admin API's token. */
  readonly adminToken: string;
  /** What proxies and node agents present to the api's internal routes. */
  readonly internalToken: string;
}

/** A cluster's secrets, generated once per data dir and kept there (mode 0600), so a restart keeps its tokens. */
export function clusterSecrets(dataDir: string): ClusterSecrets {
  const file = join(dataDir, "secrets.json");
  if (existsSync(file)) {
    const kept = JSON.parse(readFileSync(file, "utf8")) as Partial<ClusterSecrets>;
    if (kept.tokenSecret && kept.adminToken && kept.internalToken) return kept as ClusterSecrets;
  }
  const secrets: ClusterSecrets = {
    tokenSecret: randomBytes(32).toString("hex"),
    adminToken: randomBytes(24).toString("hex"),
    internalToken: randomBytes(24).toString("hex"),
  };
  writeFileSync(file, JSON.stringify(secrets), { mode: 0o600 });
  return secrets;
}
