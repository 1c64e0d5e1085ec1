import { ApiClient, requireString } from "./api.js";
import { ConnectionConfig, type ConnectionOpts } from "./config.js";
import { apiError, InvalidArgumentError } from "./errors.js";

export type ArtifactFormat = "tar" | "zip";

/** A file or folder published out of a sandbox, as it was at the publish. It outlives the sandbox. */
export interface ArtifactInfo {
  artifactId: string;
  sandboxId: string;
  /** The path in the sandbox it was taken from. */
  path: string;
  format: ArtifactFormat;
  sizeBytes: number;
  /** Hex sha256 of the archive's bytes. */
  sha256: string;
  createdAt: Date;
}

export interface ArtifactPublishOpts extends Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> {
  /** `tar` (default) or `zip`. */
  format?: ArtifactFormat;
}

export interface ArtifactUrlOpts extends Pick<ConnectionOpts, "requestTimeoutMs" | "signal"> {
  /** How long the URL works; default 15 minutes, at most a day. */
  expiresInSeconds?: number;
}

/** A signed download URL: anyone holding it can download the artifact (no API key) until `expiresAt`. */
export interface ArtifactUrl {
  url: string;
  expiresAt: Date;
}

function artifactFrom(raw: Record<string, unknown>): ArtifactInfo {
  return {
    artifactId: requireString(raw.artifactID, "artifactID"),
    sandboxId: requireString(raw.sandboxID, "sandboxID"),
    path: requireString(raw.path, "path"),
    format: raw.format === "zip" ? "zip" : "tar",
    sizeBytes: Number(raw.sizeBytes),
    sha256: requireString(raw.sha256, "sha256"),
    createdAt: new Date(String(raw.createdAt)),
  };
}

const PUBLISH_TIMEOUT_MS = 10 * 60_000;

const artifactPath = (id: string) => `/warren/v1/artifacts/${encodeURIComponent(id)}`;

/**
 * Artifacts (Warren's extra): `publish` freezes a file or folder of the sandbox into a tar or zip kept outside it;
 * the team's artifacts are listed, downloaded through short-lived signed URLs (which keep working after the
 * sandbox is gone) and deleted. The instance on a Sandbox is bound to it; the static methods need only a key.
 */
export class Artifacts {
  private readonly api: ApiClient;

  constructor(
    config: ConnectionConfig | ConnectionOpts,
    private readonly sandboxId?: string,
  ) {
    this.api = new ApiClient(config instanceof ConnectionConfig ? config : new ConnectionConfig(config));
  }

  /** `POST /warren/v1/sandboxes/{id}/artifacts`: `path` must be absolute. */
  async publish(path: string, opts: ArtifactPublishOpts = {}): Promise<ArtifactInfo> {
    const sandboxId = this.requireSandbox();
    if (!path.startsWith("/")) throw new InvalidArgumentError(`path '${path}' must be absolute`);
    const res = await this.api.request<Record<string, unknown>>({
      method: "POST",
      path: `/warren/v1/sandboxes/${encodeURIComponent(sandboxId)}/artifacts`,
      body: { path, ...(opts.format ? { format: opts.format } : {}) },
      ...(opts.signal ? { signal: opts.signal } : {}),
      // Archiving a large folder takes longer than an ordinary request.
      requestTimeoutMs: opts.requestTimeoutMs ?? PUBLISH_TIMEOUT_MS,
    });
    return artifactFrom(res.body);
  }

  /** Newest first: this sandbox's artifacts on a Sandbox's instance, else the team's. */
  async list(opts: Pick<ConnectionOpts, "signal"> = {}): Promise<ArtifactInfo[]> {
    const path = this.sandboxId
      ? `/warren/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/artifacts`
      : "/warren/v1/artifacts";
    const res = await this.api.request<Record<string, unknown>[]>({
      method: "GET",
      path,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return res.body.map(artifactFrom);
  }

  async getInfo(artifactId: string, opts: Pick<ConnectionOpts, "signal"> = {}): Promise<ArtifactInfo> {
    const res = await this.api.request<Record<string, unknown>>({
      method: "GET",
      path: artifactPath(artifactId),
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return artifactFrom(res.body);
  }

  /** A signed download URL, relative to this client's API URL (the way the SDK reached the API). */
  async downloadUrl(artifactId: string, opts: ArtifactUrlOpts = {}): Promise<ArtifactUrl> {
    const res = await this.api.request<Record<string, unknown>>({
      method: "POST",
      path: `${artifactPath(artifactId)}/url`,
      body: opts.expiresInSeconds !== undefined ? { expiresInSeconds: opts.expiresInSeconds } : {},
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return {
      url: this.api.config.apiUrl + requireString(res.body.path, "path"),
      expiresAt: new Date(requireString(res.body.expiresAt, "expiresAt")),
    };
  }

  /** The artifact's bytes (a fresh signed URL, then a plain GET of it). */
  async download(artifactId: string, opts: Pick<ConnectionOpts, "signal"> = {}): Promise<Uint8Array> {
    const { url } = await this.downloadUrl(artifactId, { expiresInSeconds: 300, ...opts });
    const res = await fetch(url, opts.signal ? { signal: opts.signal } : {});
    if (!res.ok) throw apiError(res.status, await res.text());
    return new Uint8Array(await res.arrayBuffer());
  }

  /** Deletes an artifact; false when the team has no such artifact. */
  async delete(artifactId: string, opts: Pick<ConnectionOpts, "signal"> = {}): Promise<boolean> {
    const res = await this.api.request({
      method: "DELETE",
      path: artifactPath(artifactId),
      expect: [404],
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return res.status !== 404;
  }

  private requireSandbox(): string {
    if (!this.sandboxId) throw new InvalidArgumentError("publish needs a sandbox: use sandbox.artifacts.publish(path)");
    return this.sandboxId;
  }
}
