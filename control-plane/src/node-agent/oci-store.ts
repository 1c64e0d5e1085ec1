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
import type { PackCache } from "./pack-cache.js";
import { LayoutPackStore, RegistryPackStore } from "./pack-stores.js";
import { fileReader, openPacked, type PartReader } from "./part-readers.js";
import { RegistryClient } from "./registry-client.js";
import { PACK_MEDIA_TYPE, type PackStore, type PushedPacks, packedManifest, pushPacked } from "./snapshot-packs.js";

/**
 * The cluster's store as skopeo and umoci reach it: one-layer OCI images under tags, in an OCI layout directory or
 * an OCI registry. What the images hold and how they make a snapshot is snapshot-store.ts's.
 */
export interface OciStoreConfig {
  readonly url: string;
  /** Registry over plain HTTP or with a certificate the node does not trust (loopback test registries). */
  readonly insecure: boolean;
  readonly username?: string;
  readonly password?: string;
}

/** A layer's content: the sha256 and size of its uncompressed bytes (the image's diff_id). */
export interface BlobRef {
  readonly digest: string;
  readonly size: number;
}

/** A one-layer image fetched into a scratch folder: its config, and its layer as an uncompressed file. */
export interface FetchedImage {
  readonly config: ImageConfig;
  readonly file: string;
  /** What was read from the store for it (the layer's uncompressed size). */
  readonly fetchedBytes: number;
}

export interface ImageConfig {
  readonly created?: string;
  readonly config?: { readonly Labels?: Record<string, string> | null };
  readonly rootfs?: { readonly diff_ids?: readonly string[] };
}

const LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar";
const SKOPEO_TIMEOUT_MS = 30 * 60_000;

export class OciStore {
  private readonly target: { kind: "dir"; dir: string } | { kind: "registry"; host: string; repo: string };
  /** Where own parts' packs go (one client per store: a registry's token is reused). */
  private readonly packs: PackStore;

  constructor(
    private readonly config: OciStoreConfig,
    private readonly workDir: string,
    /** A registry store's packs this node has (pack-cache.ts); a layout directory is read in place. */
    private readonly packCache?: PackCache,
  ) {
    this.target = parseStoreUrl(config.url);
    this.packs =
      this.target.kind === "dir"
        ? new LayoutPackStore(this.target.dir)
        : new RegistryPackStore(
            new RegistryClient({
              host: this.target.host,
              repo: this.target.repo,
              insecure: config.insecure,
              ...(config.username ? { username: config.username, password: config.password ?? "" } : {}),
            }),
            join(workDir, "packs"),
          );
  }

  /** A readable description of the store (never its credentials). */
  get description(): string {
    return this.target.kind === "dir" ? `oci:${this.target.dir}` : `docker://${this.target.host}/${this.target.repo}`;
  }

  private ref(tag: string): string {
    return this.target.kind === "dir"
      ? `oci:${this.target.dir}:${tag}`
      : `docker://${this.target.host}/${this.target.repo}:${tag}`;
  }

  /**
   * skopeo's options for the store side (TLS, credentials in a 0600 file, never on the command line): `src`/`dest`
   * for a copy, "" for the one-image commands (list-tags, delete, inspect).
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

  private async skopeo(args: string[]): Promise<string> {
    const run = () => exec("skopeo", ["--insecure-policy", ...args], { timeoutMs: SKOPEO_TIMEOUT_MS });
    try {
      // Writers of one layout directory take turns (its index.json is rewritten by each).
      const result = this.target.kind === "dir" ? await withFileLock(join(this.target.dir, ".lock"), run) : await run();
      return String(result.stdout);
    } catch (error) {
      throw this.failure(error);
    }
  }

  failure(error: unknown): AgentError {
    if (error instanceof AgentError) return error;
    return new AgentError("internal", `the snapshot store (${this.description}) failed: ${(error as Error).message}`);
  }

  /** A scratch folder under the work dir, removed after `job` whatever happens. */
  async inScratch<T>(what: string, job: (scratch: string) => Promise<T>): Promise<T> {
    const scratch = join(this.workDir, `${what}-${randomBytes(4).toString("hex")}`);
    await mkdir(scratch, { recursive: true });
    try {
      return await job(scratch);
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
  }

  /**
   * Sends an own part to the store packed against `base` (the same sandbox's previous publish), moving only what
   * it lacks (snapshot-packs.ts): written by this node into a layout directory (under its lock), or requests to a
   * registry.
   */
  async pushPacks(
    tag: string,
    data: () => AsyncIterable<Uint8Array>,
    labels: (ref: BlobRef) => Readonly<Record<string, string>>,
    base?: string,
  ): Promise<PushedPacks> {
    return this.withPacks(() => pushPacked(this.packs, tag, data, labels, base, this.registryCache()));
  }

  /**
   * Opens an own part for reading as one stream (part-readers.ts `PartReader`): packs, every blob checked, or (a
   * part published before packs) one layer, which in a registry is compressed and comes through skopeo into `dir`.
   */
  async openPart(tag: string, dir: string): Promise<PartReader> {
    await mkdir(dir, { recursive: true });
    const reader = await this.withPacks(async () => {
      const manifest = await packedManifest(this.packs, tag);
      if (!manifest) throw new AgentError("not_found", `'${tag}' is not in the store`);
      if (this.target.kind === "registry" && manifest.layers.some((layer) => layer.mediaType !== PACK_MEDIA_TYPE)) {
        return undefined;
      }
      return openPacked(this.packs, tag, manifest, dir, this.registryCache());
    });
    if (reader) return reader;
    const fetched = await this.fetch(tag, dir);
    return fileReader(fetched.config, fetched.file, fetched.fetchedBytes, tag);
  }

  /**
   * Opens a one-layer image (a shared layer) for reading: a layout's uncompressed layer in place, anything else
   * fetched by skopeo into `dir` first. The caller checks the digest `finish` answers.
   */
  async openLayer(tag: string, dir: string): Promise<PartReader> {
    const inPlace =
      this.target.kind === "dir"
        ? await this.withPacks(async () => {
            const bytes = await this.packs.getManifest(tag);
            if (!bytes) throw new AgentError("not_found", `'${tag}' is not in the store`);
            const manifest = JSON.parse(bytes.toString()) as OciManifest;
            const layer = manifest.layers[0];
            if (!layer || manifest.layers.length !== 1) {
              throw new AgentError("failed_precondition", `'${tag}' in the store is not a part of a Warren snapshot`);
            }
            if (layer.mediaType !== LAYER_MEDIA_TYPE || !this.packs.localBlob) return undefined;
            const config = JSON.parse(
              await readFile(this.packs.localBlob(manifest.config.digest), "utf8"),
            ) as ImageConfig;
            // Opened under the lock: a collection that removes it meanwhile leaves this read whole.
            return fileReader(config, this.packs.localBlob(layer.digest), undefined, tag);
          })
        : undefined;
    if (inPlace) return inPlace;
    await mkdir(dir, { recursive: true });
    const fetched = await this.fetch(tag, dir);
    return fileReader(fetched.config, fetched.file, fetched.fetchedBytes, tag);
  }

  private registryCache(): PackCache | undefined {
    return this.target.kind === "registry" ? this.packCache : undefined;
  }

  /** A pack job, under the layout's lock for a directory (writers of its index.json take turns). */
  private withPacks<T>(job: () => Promise<T>): Promise<T> {
    const locked = this.target.kind === "dir" ? withFileLock(join(this.target.dir, ".lock"), job) : job();
    return locked.catch((error) => {
      throw this.failure(error);
    });
  }

  /**
   * Writes `data` as a one-layer OCI image into a scratch layout and copies it to the store as `tag`; resolves with
   * the layer's digest and size.
   */
  async push(
    tag: string,
    data: AsyncIterable<Uint8Array>,
    /** The image's labels, which may name its layer's digest and size. */
    labels: (ref: BlobRef) => Readonly<Record<string, string>>,
  ): Promise<BlobRef> {
    return this.inScratch("publish", async (scratch) => {
      const layout = join(scratch, "layout");
      await mkdir(join(layout, "blobs", "sha256"), { recursive: true });
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
      const ref = { digest: `sha256:${layerHex}`, size };
      await rename(layerTmp, join(layout, "blobs", "sha256", layerHex));
      const ownLabels = labels(ref);
      const config = Buffer.from(
        JSON.stringify({
          architecture: "amd64",
          os: "linux",
          created: new Date().toISOString(),
          config: { Labels: ownLabels },
          rootfs: { type: "layers", diff_ids: [ref.digest] },
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
          layers: [{ mediaType: LAYER_MEDIA_TYPE, digest: ref.digest, size }],
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
              annotations: { "org.opencontainers.image.ref.name": tag },
            },
          ],
        }),
      );
      if (this.target.kind === "dir") await mkdir(this.target.dir, { recursive: true });
      await this.skopeo([
        "copy",
        ...(await this.storeOptions("dest", scratch)),
        // Into the embedded directory the layer stays as it is: compressing it costs seconds of CPU per 100 MB at
        // every pause (and unpacking it as much at every pull), for a copy that never crosses a network.
        ...(this.target.kind === "dir" ? ["--dest-oci-accept-uncompressed-layers"] : []),
        `oci:${layout}:${tag}`,
        this.ref(tag),
      ]);
      return ref;
    });
  }

  /** Every tag in the store. */
  async listTags(): Promise<string[]> {
    if (this.target.kind === "dir") {
      let index: { manifests?: { annotations?: Record<string, string> }[] };
      try {
        index = JSON.parse(await readFile(join(this.target.dir, "index.json"), "utf8"));
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
        throw this.failure(error);
      }
      return (index.manifests ?? [])
        .map((m) => m.annotations?.["org.opencontainers.image.ref.name"] ?? "")
        .filter((name) => name !== "");
    }
    const { host, repo } = this.target;
    return this.inScratch("list", async (scratch) => {
      try {
        const stdout = await this.skopeo([
          "list-tags",
          ...(await this.storeOptions("", scratch)),
          `docker://${host}/${repo}`,
        ]);
        return (JSON.parse(stdout) as { Tags?: string[] | null }).Tags ?? [];
      } catch (error) {
        // A registry that was never pushed to does not know the repository yet.
        // (docker-registry 2.8 answers its tags list with a plain 404.)
        if (
          /name unknown|NAME_UNKNOWN|repository name not known|status code from registry 404/i.test(
            (error as Error).message,
          )
        ) {
          return [];
        }
        throw error;
      }
    });
  }

  /** The image config of a tag (undefined when the store does not have it). */
  async readConfig(tag: string): Promise<ImageConfig | undefined> {
    if (this.target.kind === "dir") {
      const dir = this.target.dir;
      try {
        const index = JSON.parse(await readFile(join(dir, "index.json"), "utf8")) as OciIndex;
        const entry = index.manifests.find((m) => m.annotations?.["org.opencontainers.image.ref.name"] === tag);
        if (!entry) return undefined;
        const manifest = JSON.parse(await readFile(blobPath(dir, entry.digest), "utf8")) as OciManifest;
        return JSON.parse(await readFile(blobPath(dir, manifest.config.digest), "utf8")) as ImageConfig;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
        throw this.failure(error);
      }
    }
    return this.inScratch("inspect", async (scratch) => {
      try {
        return JSON.parse(
          await this.skopeo(["inspect", "--config", ...(await this.storeOptions("", scratch)), this.ref(tag)]),
        ) as ImageConfig;
      } catch (error) {
        if (/manifest unknown|MANIFEST_UNKNOWN|not found/i.test((error as Error).message)) return undefined;
        throw error;
      }
    });
  }

  /** Removes tags (and, in a layout directory, the blobs only they used); false when none was there. */
  async remove(tags: readonly string[]): Promise<boolean> {
    const present = new Set(await this.listTags());
    const gone = tags.filter((tag) => present.has(tag));
    if (gone.length === 0) return false;
    if (this.target.kind === "dir") {
      const dir = this.target.dir;
      await withFileLock(join(dir, ".lock"), async () => {
        for (const tag of gone)
          await exec("umoci", ["remove", "--image", `${dir}:${tag}`], { timeoutMs: SKOPEO_TIMEOUT_MS });
        await exec("umoci", ["gc", "--layout", dir], { timeoutMs: SKOPEO_TIMEOUT_MS });
      }).catch((error) => {
        throw this.failure(error);
      });
      return true;
    }
    for (const tag of gone) {
      await this.inScratch("unpublish", async (scratch) => {
        try {
          await this.skopeo(["delete", ...(await this.storeOptions("", scratch)), this.ref(tag)]);
        } catch (error) {
          if (!/manifest unknown|MANIFEST_UNKNOWN|not found/i.test((error as Error).message)) throw error;
        }
      });
    }
    return true;
  }

  /**
   * Copies a one-layer image from the store into `dir`: its config, and its layer as an uncompressed file, whose
   * digest the caller checks as it reads it (`fileReader`). A registry holds layers compressed (skopeo compresses
   * on push): the digest is the uncompressed content's (the image's diff_id), checked on the bytes the driver
   * will import.
   */
  async fetch(tag: string, dir: string): Promise<FetchedImage> {
    const layout = join(dir, "layout");
    await mkdir(dir, { recursive: true });
    await this.skopeo([
      "copy",
      ...(await this.storeOptions("src", dir)),
      "--dest-oci-accept-uncompressed-layers",
      this.ref(tag),
      `oci:${layout}:${tag}`,
    ]);
    const index = JSON.parse(await readFile(join(layout, "index.json"), "utf8")) as OciIndex;
    const manifest = JSON.parse(
      await readFile(blobPath(layout, index.manifests[0]?.digest ?? ""), "utf8"),
    ) as OciManifest;
    const config = JSON.parse(await readFile(blobPath(layout, manifest.config.digest), "utf8")) as ImageConfig;
    const layer = manifest.layers[0];
    if (!layer || manifest.layers.length !== 1) {
      throw new AgentError("failed_precondition", `'${tag}' in the store is not a part of a Warren snapshot`);
    }
    const blob = blobPath(layout, layer.digest);
    let file = blob;
    if (layer.mediaType.endsWith("+gzip")) {
      file = join(dir, "layer.tar");
      await pipeline(createReadStream(blob), createGunzip(), createWriteStream(file));
    }
    const { size } = await stat(file);
    return { config, file, fetchedBytes: size };
  }
}

interface OciIndex {
  readonly manifests: readonly { readonly digest: string; readonly annotations?: Record<string, string> }[];
}

interface OciManifest {
  readonly config: { readonly digest: string };
  readonly layers: readonly { readonly digest: string; readonly mediaType: string }[];
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
