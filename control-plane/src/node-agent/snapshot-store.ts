import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGunzip } from "node:zlib";
import { exec } from "../runtime/exec.js";
import { withFileLock } from "../runtime/file-lock.js";
import { AgentError } from "./errors.js";
import type { Logger } from "./log.js";

/**
 * Where built templates (their ready snapshot and layers) live beyond the node that built them, so every node can
 * start sandboxes of them:
 *  - `oci:<dir>`: an OCI image layout in a directory (the embedded default: one node, or a filesystem the nodes
 *    share);
 *  - `docker://<host>[:port]/<path>`: an OCI registry (any registry a platform team runs; Debian's
 *    `docker-registry` in tests).
 * Each snapshot is one OCI image: its driver's export stream (a tar of its layers, and memory where it has
 * some) as the single layer, Warren's description in the config's labels, tagged with the snapshot id. skopeo
 * moves it and checks every blob's digest; the pulling node checks the layer's digest against the one the master
 * recorded at publish, so a re-tagged or corrupted image is never imported.
 */
export interface SnapshotStoreConfig {
  readonly url: string;
  /** Registry over plain HTTP or with a certificate the node does not trust (loopback test registries). */
  readonly insecure: boolean;
  readonly username?: string;
  readonly password?: string;
}

export interface PublishedSnapshot {
  /** `sha256:<hex>` of the snapshot's layer (its export stream). */
  readonly digest: string;
  readonly sizeBytes: number;
}

const LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar";
const SKOPEO_TIMEOUT_MS = 30 * 60_000;

export class SnapshotStore {
  private readonly target: { kind: "dir"; dir: string } | { kind: "registry"; host: string; repo: string };

  constructor(
    private readonly config: SnapshotStoreConfig,
    private readonly workDir: string,
    private readonly log: Logger,
  ) {
    this.target = parseStoreUrl(config.url);
  }

  /** A readable description of the store (never its credentials). */
  get description(): string {
    return this.target.kind === "dir" ? `oci:${this.target.dir}` : `docker://${this.target.host}/${this.target.repo}`;
  }

  private ref(snapshotId: string): string {
    return this.target.kind === "dir"
      ? `oci:${this.target.dir}:${snapshotId}`
      : `docker://${this.target.host}/${this.target.repo}:${snapshotId}`;
  }

  /**
   * skopeo's options for the store side (TLS, credentials in a 0600 file, never on the command line): `src`/`dest`
   * for a copy, "" for the one-image commands (list-tags, delete).
   */
  private async storeOptions(side: "src" | "dest" | "", scratch: string): Promise<string[]> {
    if (this.target.kind === "dir") return [];
    const prefix = side ? `--${side}-` : "--";
    const options = [`${prefix}tls-verify=${this.config.insecure ? "false" : "true"}`];
    if (this.config.username) {
      const authFile = join(scratch, "auth.json");
      const auth = Buffer.from(`${this.config.username}:${this.config.password ?? ""}`).toString("base64");
      await writeFile(authFile, JSON.stringify({ auths: { [this.target.host]: { auth } } }), { mode: 0o600 });
      options.push(`${prefix}authfile`, authFile);
    }
    return options;
  }

  private async skopeo(args: string[]): Promise<void> {
    const run = () => exec("skopeo", ["--insecure-policy", ...args], { timeoutMs: SKOPEO_TIMEOUT_MS });
    try {
      // Writers of one layout directory take turns (its index.json is rewritten by each).
      if (this.target.kind === "dir") await withFileLock(join(this.target.dir, ".lock"), run);
      else await run();
    } catch (error) {
      throw new AgentError("internal", `the snapshot store (${this.description}) failed: ${(error as Error).message}`);
    }
  }

  private async skopeoOutput(args: string[]): Promise<{ stdout: string }> {
    try {
      const result = await exec("skopeo", ["--insecure-policy", ...args], { timeoutMs: SKOPEO_TIMEOUT_MS });
      return { stdout: String(result.stdout) };
    } catch (error) {
      throw new AgentError("internal", `the snapshot store (${this.description}) failed: ${(error as Error).message}`);
    }
  }

  /** Publishes a snapshot's export stream under its id; resolves with the layer's digest. */
  async publish(
    snapshotId: string,
    data: AsyncIterable<Uint8Array>,
    labels: Readonly<Record<string, string>>,
  ): Promise<PublishedSnapshot> {
    const scratch = join(this.workDir, `publish-${snapshotId}-${randomBytes(4).toString("hex")}`);
    const layout = join(scratch, "layout");
    await mkdir(join(layout, "blobs", "sha256"), { recursive: true });
    try {
      const layerTmp = join(scratch, "layer.tar");
      const hash = createHash("sha256");
      let size = 0;
      await pipeline(
        Readable.from(data),
        async function* (source) {
          for await (const chunk of source) {
            hash.update(chunk as Buffer);
            size += (chunk as Buffer).length;
            yield chunk;
          }
        },
        createWriteStream(layerTmp),
      );
      const layerHex = hash.digest("hex");
      await rename(layerTmp, join(layout, "blobs", "sha256", layerHex));
      const config = Buffer.from(
        JSON.stringify({
          architecture: "amd64",
          os: "linux",
          config: { Labels: { ...labels, "dev.warren.snapshot": snapshotId } },
          rootfs: { type: "layers", diff_ids: [`sha256:${layerHex}`] },
        }),
      );
      const configHex = await writeBlob(layout, config);
      const manifest = Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: {
            mediaType: "application/vnd.oci.image.config.v1+json",
            digest: `sha256:${configHex}`,
            size: config.length,
          },
          layers: [{ mediaType: LAYER_MEDIA_TYPE, digest: `sha256:${layerHex}`, size }],
        }),
      );
      const manifestHex = await writeBlob(layout, manifest);
      await writeFile(join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
      await writeFile(
        join(layout, "index.json"),
        JSON.stringify({
          schemaVersion: 2,
          manifests: [
            {
              mediaType: "application/vnd.oci.image.manifest.v1+json",
              digest: `sha256:${manifestHex}`,
              size: manifest.length,
              annotations: { "org.opencontainers.image.ref.name": snapshotId },
            },
          ],
        }),
      );
      if (this.target.kind === "dir") await mkdir(this.target.dir, { recursive: true });
      const started = performance.now();
      await this.skopeo([
        "copy",
        ...(await this.storeOptions("dest", scratch)),
        // Into the embedded directory the layer stays as it is: compressing it costs seconds of CPU per 100 MB at
        // every pause (and unpacking it as much at every pull), for a copy that never crosses a network.
        ...(this.target.kind === "dir" ? ["--dest-oci-accept-uncompressed-layers"] : []),
        `oci:${layout}:${snapshotId}`,
        this.ref(snapshotId),
      ]);
      this.log.info("snapshot published", {
        snapshotId,
        store: this.description,
        sizeMiB: Math.round(size / 2 ** 20),
        ms: Math.round(performance.now() - started),
      });
      return { digest: `sha256:${layerHex}`, sizeBytes: size };
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }

  /**
   * The snapshot ids published to the store. A registry lists its tags; a layout directory its index (an empty
   * list when the store was never written to).
   */
  async listPublished(): Promise<string[]> {
    if (this.target.kind === "dir") {
      let index: { manifests?: { annotations?: Record<string, string> }[] };
      try {
        index = JSON.parse(await readFile(join(this.target.dir, "index.json"), "utf8"));
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
        throw new AgentError(
          "internal",
          `the snapshot store (${this.description}) failed: ${(error as Error).message}`,
        );
      }
      return (index.manifests ?? [])
        .map((m) => m.annotations?.["org.opencontainers.image.ref.name"] ?? "")
        .filter((name) => name !== "");
    }
    const scratch = join(this.workDir, `list-${randomBytes(4).toString("hex")}`);
    await mkdir(scratch, { recursive: true });
    try {
      const { stdout } = await this.skopeoOutput([
        "list-tags",
        ...(await this.storeOptions("", scratch)),
        `docker://${this.target.host}/${this.target.repo}`,
      ]);
      return (JSON.parse(stdout) as { Tags?: string[] | null }).Tags ?? [];
    } catch (error) {
      // A registry that was never pushed to does not know the repository yet.
      if (/name unknown|NAME_UNKNOWN|repository name not known/i.test((error as Error).message)) return [];
      throw error;
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }

  /**
   * Removes a published snapshot from the store; idempotent. A layout directory drops the tag and then every blob
   * nothing else refers to. A registry deletes the manifest (its blobs go with the registry's own garbage
   * collection, which needs `storage.delete.enabled`).
   */
  async unpublish(snapshotId: string): Promise<void> {
    if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/.test(snapshotId)) {
      throw new AgentError("invalid_argument", `'${snapshotId}' is not a snapshot id`);
    }
    if (this.target.kind === "dir") {
      const dir = this.target.dir;
      if (!(await this.listPublished()).includes(snapshotId)) return;
      await withFileLock(join(dir, ".lock"), async () => {
        await exec("umoci", ["remove", "--image", `${dir}:${snapshotId}`], { timeoutMs: SKOPEO_TIMEOUT_MS });
        await exec("umoci", ["gc", "--layout", dir], { timeoutMs: SKOPEO_TIMEOUT_MS });
      }).catch((error) => {
        throw new AgentError(
          "internal",
          `the snapshot store (${this.description}) failed: ${(error as Error).message}`,
        );
      });
    } else {
      const scratch = join(this.workDir, `unpublish-${snapshotId}-${randomBytes(4).toString("hex")}`);
      await mkdir(scratch, { recursive: true });
      try {
        await this.skopeo(["delete", ...(await this.storeOptions("", scratch)), this.ref(snapshotId)]);
      } catch (error) {
        if (!/manifest unknown|MANIFEST_UNKNOWN|not found/i.test((error as Error).message)) throw error;
      } finally {
        await rm(scratch, { recursive: true, force: true });
      }
    }
    this.log.info("snapshot unpublished", { snapshotId, store: this.description });
  }

  /**
   * Pulls a published snapshot and hands its layer, checked against `digest`, to `consume` (the driver's import);
   * the scratch copy is removed afterwards whatever happens.
   */
  async pull<T>(
    snapshotId: string,
    digest: string,
    consume: (data: AsyncIterable<Uint8Array>) => Promise<T>,
  ): Promise<T> {
    if (!/^sha256:[0-9a-f]{64}$/.test(digest)) {
      throw new AgentError("invalid_argument", `digest must be sha256:<64 hex>, got '${digest}'`);
    }
    const scratch = join(this.workDir, `pull-${snapshotId}-${randomBytes(4).toString("hex")}`);
    const layout = join(scratch, "layout");
    await mkdir(scratch, { recursive: true });
    try {
      const started = performance.now();
      await this.skopeo([
        "copy",
        ...(await this.storeOptions("src", scratch)),
        "--dest-oci-accept-uncompressed-layers",
        this.ref(snapshotId),
        `oci:${layout}:${snapshotId}`,
      ]);
      const index = JSON.parse(await readFile(join(layout, "index.json"), "utf8")) as {
        manifests: { digest: string }[];
      };
      const manifestDigest = index.manifests[0]?.digest ?? "";
      const manifest = JSON.parse(await readFile(blobPath(layout, manifestDigest), "utf8")) as {
        layers: { digest: string; mediaType: string }[];
      };
      const layer = manifest.layers[0];
      if (!layer || manifest.layers.length !== 1) {
        throw new AgentError("failed_precondition", `snapshot '${snapshotId}' in the store is not a Warren snapshot`);
      }
      // A registry holds the layer compressed (skopeo compresses on push): the digest published is the uncompressed
      // content's (the image's diff_id), checked on the bytes the driver will import. An uncompressed layer (the
      // embedded store's) is only read to hash it and imported from where skopeo put it.
      const hash = createHash("sha256");
      const blob = blobPath(layout, layer.digest);
      let file = blob;
      if (layer.mediaType.endsWith("+gzip")) {
        file = join(scratch, "layer.tar");
        const hashed = async function* (input: AsyncIterable<Buffer>) {
          for await (const chunk of input) {
            hash.update(chunk);
            yield chunk;
          }
        };
        await pipeline(createReadStream(blob), createGunzip(), hashed, createWriteStream(file));
      } else {
        for await (const chunk of createReadStream(blob, { highWaterMark: 1 << 20 })) hash.update(chunk as Buffer);
      }
      if (`sha256:${hash.digest("hex")}` !== digest) {
        throw new AgentError(
          "failed_precondition",
          `snapshot '${snapshotId}' in the store does not match the published ${digest} (replaced or corrupted)`,
        );
      }
      const { size } = await stat(file);
      const result = await consume(createReadStream(file, { highWaterMark: 1 << 20 }));
      this.log.info("snapshot pulled", {
        snapshotId,
        store: this.description,
        sizeMiB: Math.round(size / 2 ** 20),
        ms: Math.round(performance.now() - started),
      });
      return result;
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }
}

async function writeBlob(layout: string, data: Buffer): Promise<string> {
  const hex = createHash("sha256").update(data).digest("hex");
  await writeFile(join(layout, "blobs", "sha256", hex), data);
  return hex;
}

function blobPath(layout: string, digest: string): string {
  const match = /^sha256:([0-9a-f]{64})$/.exec(digest);
  if (!match) throw new AgentError("internal", `the store answered an invalid digest '${digest}'`);
  return join(layout, "blobs", "sha256", match[1] as string);
}

/** `oci:<absolute dir>` or `docker://<host>[:port]/<path>`; anything else is a configuration error. */
export function parseStoreUrl(
  url: string,
): { kind: "dir"; dir: string } | { kind: "registry"; host: string; repo: string } {
  if (url.startsWith("oci:")) {
    const dir = url.slice(4);
    if (!dir.startsWith("/") || dir.includes(":")) throw new Error(`store '${url}': oci: needs an absolute directory`);
    return { kind: "dir", dir };
  }
  const registry = /^docker:\/\/([A-Za-z0-9.-]+(?::\d+)?)\/([a-z0-9]+(?:[._/-][a-z0-9]+)*)$/.exec(url);
  if (registry) return { kind: "registry", host: registry[1] as string, repo: `${registry[2]}/snapshots` };
  throw new Error(`store '${url}' must be oci:<absolute dir> or docker://<host[:port]>/<path>`);
}
