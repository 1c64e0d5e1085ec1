/** The api's one configuration object, from environment variables (documented defaults). */
export interface ApiConfig {
  /** WARREN_API_PORT (default 3000). */
  readonly port: number;
  /** WARREN_API_HOST (default 127.0.0.1). */
  readonly host: string;
  /** DATABASE_URL (default postgres://postgres@127.0.0.1:5432/warren). */
  readonly databaseUrl: string;
  /** WARREN_DB_SCHEMA (default warren). */
  readonly schema: string;
  /** WARREN_MASTER_URL (default http://127.0.0.1:3100). */
  readonly masterUrl: string;
  /** WARREN_ADMIN_TOKEN: enables /warren/v1/admin/* when set (≥ 16 characters). */
  readonly adminToken: string;
  /** WARREN_INTERNAL_TOKEN: enables /warren/v1/internal/* (the proxy's auto-resume) when set (≥ 16 characters). */
  readonly internalToken: string;
  /** WARREN_TEMPLATE_UPLOAD_MAX_BYTES: the largest template COPY archive accepted (default 256 MiB). */
  readonly maxTemplateUploadBytes: number;
  /** WARREN_TEAM_MAX_BUILDS: template builds a team may have waiting or running at once (default 5). */
  readonly maxActiveBuildsPerTeam: number;
}

function positiveInt(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a positive integer, got '${raw}'`);
  return value;
}

export function loadApiConfig(env: NodeJS.ProcessEnv = process.env): ApiConfig {
  const port = Number(env.WARREN_API_PORT ?? 3000);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`WARREN_API_PORT must be a port number, got '${env.WARREN_API_PORT}'`);
  }
  const adminToken = env.WARREN_ADMIN_TOKEN ?? "";
  if (adminToken !== "" && adminToken.length < 16) throw new Error("WARREN_ADMIN_TOKEN must be at least 16 characters");
  const internalToken = env.WARREN_INTERNAL_TOKEN ?? "";
  if (internalToken !== "" && internalToken.length < 16) {
    throw new Error("WARREN_INTERNAL_TOKEN must be at least 16 characters");
  }
  return {
    port,
    host: env.WARREN_API_HOST || "127.0.0.1",
    databaseUrl: env.DATABASE_URL || "postgres://postgres@127.0.0.1:5432/warren",
    schema: env.WARREN_DB_SCHEMA || "warren",
    masterUrl: env.WARREN_MASTER_URL || "http://127.0.0.1:3100",
    adminToken,
    internalToken,
    maxTemplateUploadBytes: positiveInt(env, "WARREN_TEMPLATE_UPLOAD_MAX_BYTES", 256 * 1024 * 1024),
    maxActiveBuildsPerTeam: positiveInt(env, "WARREN_TEAM_MAX_BUILDS", 5),
  };
}
