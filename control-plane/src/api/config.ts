import { createHmac } from "node:crypto";
import { ConfigError, DATABASE_URL, integerFromEnv, renamedEnv, warnOnStderr } from "@warren/platform/env";
import { parseSecretKeys, type SecretKeyRing } from "../store/secret-box.js";
import { type ConsoleConfig, loadConsoleConfig } from "./console.js";

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
  /**
   * WARREN_API_KEY_CACHE_MS (default 60000; 0: off): how long a known key's identity is kept in memory
   * (store/api-key-cache.ts). Changes to teams and keys empty the cache when they commit; this only bounds a lost
   * notification.
   */
  readonly apiKeyCacheMs: number;
  /**
   * WARREN_ECR_ENDPOINT (default: AWS's endpoint of the keys' region): where `fromAWSRegistry`'s keys are exchanged
   * for an ECR login (a VPC endpoint, `https://…`).
   */
  readonly ecrEndpoint: string | undefined;
  /** WARREN_CONSOLE_DIR, WARREN_CONSOLE_SANDBOX_URL: the web console (api/console.ts). */
  readonly console: ConsoleConfig;
  /**
   * WARREN_SECRETS_KEYS (unset: the secrets API answers 503): comma-separated `<id>:<base64 of 32 random bytes>`,
   * newest first. The newest seals new and updated secrets (AES-256-GCM); any listed key opens what it sealed, and
   * the api re-seals older rows with the newest key at start, after which an old key can be dropped.
   */
  readonly secretKeys: SecretKeyRing | undefined;
  /**
   * WARREN_VOLUMES_DIR (default /var/lib/warren/volumes): where volumes' files live, `<dir>/<team>/<volume id>`.
   * The api (content API) and every node agent (mounts) must see the same filesystem there. Empty: volumes are
   * off (their endpoints answer 403, as E2B's do when disabled).
   */
  readonly volumesDir: string;
  /**
   * WARREN_VOLUME_QUOTA_MB (default 10240): a new volume's quota. Enforced on writes through the content API, and
   * with `volumeImages` on every write, from sandboxes too.
   */
  readonly volumeQuotaMB: number;
  /**
   * WARREN_VOLUME_IMAGES (`1`, default off): each new volume is a filesystem of its quota's size in an image file
   * next to its folder, loop-mounted there (runtime/volume-images.ts), so the quota binds writes from sandboxes.
   * Only where the api and every node agent run on one host (`warren up` turns it on); several hosts share plain
   * folders (NFS), whose server sets quotas.
   */
  readonly volumeImages: boolean;
  /** Artifacts published out of sandboxes (api/artifacts.ts). */
  readonly artifacts: ArtifactConfig;
}

export interface ArtifactConfig {
  /** WARREN_ARTIFACTS_DIR (default /var/lib/warren/artifacts): the content-addressed blobs; every api replica's. */
  readonly dir: string;
  /** WARREN_ARTIFACT_MAX_MB (default 1024): the largest archive one publish may make (larger: 413). */
  readonly maxMB: number;
  /** WARREN_ARTIFACT_RETENTION_COUNT (default 100): artifacts a team keeps; a publish past it drops the oldest. */
  readonly retentionCount: number;
  /** WARREN_ARTIFACT_RETENTION_MB (default 10240): bytes a team keeps; a publish past it drops the oldest. */
  readonly retentionMB: number;
  /**
   * WARREN_ARTIFACT_URL_KEY (≥ 32 characters): signs download URLs; the same on every replica. Unset: derived from
   * WARREN_INTERNAL_TOKEN; neither: download URLs answer 503.
   */
  readonly urlKey: Buffer | undefined;
}

/** A count or size setting: a positive integer; unset or empty gives `fallback`. */
function positiveInt(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  return integerFromEnv(env, name, fallback, 1, Number.MAX_SAFE_INTEGER);
}

function absoluteDir(env: NodeJS.ProcessEnv, name: string, fallback: string): string {
  const raw = env[name] || fallback;
  if (!raw.startsWith("/")) throw new ConfigError(`${name} must be an absolute path, got '${raw}'`);
  return raw;
}

function artifactUrlKey(env: NodeJS.ProcessEnv, internalToken: string): Buffer | undefined {
  const given = env.WARREN_ARTIFACT_URL_KEY ?? "";
  if (given !== "" && given.length < 32)
    throw new ConfigError("WARREN_ARTIFACT_URL_KEY must be at least 32 characters");
  // A derived key, so a signature never doubles as (or reveals anything of) the internal token itself.
  const secret = given || internalToken;
  return secret ? createHmac("sha256", secret).update("warren-artifact-download-url").digest() : undefined;
}

export function loadApiConfig(
  env: NodeJS.ProcessEnv = process.env,
  warn: (message: string) => void = warnOnStderr("api"),
): ApiConfig {
  const port = integerFromEnv(env, "WARREN_API_PORT", 3000, 0, 65535);
  const adminToken = env.WARREN_ADMIN_TOKEN ?? "";
  if (adminToken !== "" && adminToken.length < 16)
    throw new ConfigError("WARREN_ADMIN_TOKEN must be at least 16 characters");
  const internalToken = env.WARREN_INTERNAL_TOKEN ?? "";
  if (internalToken !== "" && internalToken.length < 16) {
    throw new ConfigError("WARREN_INTERNAL_TOKEN must be at least 16 characters");
  }
  return {
    port,
    host: env.WARREN_API_HOST || "127.0.0.1",
    databaseUrl: renamedEnv(env, DATABASE_URL, warn) || "postgres://postgres@127.0.0.1:5432/warren",
    schema: env.WARREN_DB_SCHEMA || "warren",
    masterUrl: env.WARREN_MASTER_URL || "http://127.0.0.1:3100",
    adminToken,
    internalToken,
    maxTemplateUploadBytes: positiveInt(env, "WARREN_TEMPLATE_UPLOAD_MAX_BYTES", 256 * 1024 * 1024),
    maxActiveBuildsPerTeam: positiveInt(env, "WARREN_TEAM_MAX_BUILDS", 5),
    apiKeyCacheMs: integerFromEnv(env, "WARREN_API_KEY_CACHE_MS", 60_000, 0, 86_400_000),
    ecrEndpoint: httpUrl(env, "WARREN_ECR_ENDPOINT"),
    console: loadConsoleConfig(env),
    secretKeys: parseSecretKeys(env.WARREN_SECRETS_KEYS ?? ""),
    volumesDir: env.WARREN_VOLUMES_DIR === "" ? "" : absoluteDir(env, "WARREN_VOLUMES_DIR", "/var/lib/warren/volumes"),
    volumeQuotaMB: positiveInt(env, "WARREN_VOLUME_QUOTA_MB", 10240),
    volumeImages: ["1", "true", "yes"].includes((env.WARREN_VOLUME_IMAGES ?? "").toLowerCase()),
    artifacts: {
      dir: absoluteDir(env, "WARREN_ARTIFACTS_DIR", "/var/lib/warren/artifacts"),
      maxMB: positiveInt(env, "WARREN_ARTIFACT_MAX_MB", 1024),
      retentionCount: positiveInt(env, "WARREN_ARTIFACT_RETENTION_COUNT", 100),
      retentionMB: positiveInt(env, "WARREN_ARTIFACT_RETENTION_MB", 10240),
      urlKey: artifactUrlKey(env, internalToken),
    },
  };
}

function httpUrl(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const value = env[name];
  if (!value) return undefined;
  let url: URL | undefined;
  try {
    url = new URL(value);
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== "https:" && url.protocol !== "http:")) {
    throw new ConfigError(`${name} must be an http(s) URL, got '${value}'`);
  }
  return value;
}
