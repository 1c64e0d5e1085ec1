import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rename, rm } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ExecError, exec } from "../../runtime/exec.js";
import { ImageError } from "./errors.js";
import { formatImageRef, type ImageRef, parseImageRef, registryHost } from "./image-ref.js";
import {
  choosePlatform,
  describeManifest,
  hostPlatform,
  type ImageConfig,
  type ImageManifest,
  manifestDigest,
  readLayoutConfig,
} from "./manifest.js";
import { type PreparedRootfs, prepareRootfs } from "./prepare.js";
import { type ImageCredentials, Skopeo } from "./skopeo.js";

export type { ImageCredentials } from "./skopeo.js";

const DEFAULT_TIMEOUT_MS = 10 * 60_000;
/** As node-agent/config.ts finds it (src/ or dist/ alike). */
const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
const HOST_PORT = /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?|\[[a-fA-F0-9:]+\])(?::[0-9]{1,5})?$/;

export interface PullImageOptions {
  /** As E2B sends it: `ubuntu:22.04`, `library/debian:stable`, `127.0.0.1:5000/team/img:v1`, `img@sha256:…`. */
  readonly ref: string;
  readonly credentials?: ImageCredentials;
  /** `host[:port]` contacted instead of docker.io for Docker Hub names (credentials, if any, go to it). */
  readonly dockerHubMirror?: string;
  /** `host:port` of registries served over plain HTTP (loopback test registries). */
  readonly insecureRegistries?: readonly string[];
  /** Scratch space: a directory of this pull is made in it and removed after, whatever happens. */
  readonly workDir: string;
  /** Where the prepared rootfs goes; must not exist. It appears whole (renamed from a sibling) or not at all. */
  readonly destRootfs: string;
  /** The namespace driver's uid shift (WARREN_UID_BASE). */
  readonly uidBase: number;
  /** The host binary the driver bind-mounts at /opt/warren/bin/node; default: this process's. */
  readonly nodeBinary?: string;
  /** The node agent's envdRoot (envd, proto, node_modules bound into sandboxes); default: this repository. */
  readonly envdRoot?: string;
  /** Default 10 minutes. */
  readonly timeoutMs?: number;
  /** Cap on the image: its compressed layers (checked before the download) and its unpacked files. */
  readonly maxBytes?: number;
  /** Progress for the build log (never carries credentials). */
  readonly onLog?: (line: string) => void;
}

export interface PulledImage {
  /** The reference, normalised: `docker.io/library/ubuntu:22.04`. */
  readonly ref: string;
  /** Digest of what the reference resolved to (the manifest list when there is one): `ref@digest` pulls it again. */
  readonly digest: string;
  /** Digest of this platform's manifest. */
  readonly manifestDigest: string;
  readonly config: ImageConfig;
  readonly prepared: PreparedRootfs;
}

/**
 * Pulls an image from a registry and turns it into a template rootfs (prepare.ts): skopeo resolves the reference
 * (and this host's platform in a manifest list) and copies that image by digest into an OCI layout; umoci unpacks
 * its layers (whiteouts, hardlinks, xattrs; layer tars cannot write outside the rootfs) into a sibling of
 * `destRootfs`, which is prepared and renamed into place. Both tools are Debian packages and need no daemon.
 */
export async function pullImageRootfs(options: PullImageOptions): Promise<PulledImage> {
  const started = Date.now();
  const ref = parseImageRef(options.ref);
  const name = options.ref;
  const log = (line: string) => options.onLog?.(line);
  if (options.dockerHubMirror !== undefined && !HOST_PORT.test(options.dockerHubMirror)) {
    throw new ImageError("failed", `docker hub mirror '${options.dockerHubMirror}' is not host[:port]`);
  }
  if (existsSync(options.destRootfs)) throw new ImageError("failed", `${options.destRootfs} already exists`);
  const host = registryHost(ref, options.dockerHubMirror);
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const deadline = started + timeoutMs;
  await mkdir(options.workDir, { recursive: true });
  await mkdir(dirname(options.destRootfs), { recursive: true });
  const scratch = await mkdtemp(join(options.workDir, "pull-"));
  // A sibling of the destination (same filesystem), so the finished rootfs is renamed into place in one step.
  const staging = join(
    dirname(options.destRootfs),
    `.${basename(options.destRootfs)}.unpack-${randomBytes(4).toString("hex")}`,
  );
  try {
    const skopeo = await Skopeo.open({
      host,
      insecure: options.insecureRegistries?.includes(host) === true,
      ...(options.credentials ? { credentials: options.credentials } : {}),
      dir: scratch,
      deadline,
      timeoutMs,
      imageName: name,
    });
    log(`resolving ${formatImageRef(ref)}${host !== ref.registry ? ` via mirror ${host}` : ""}`);
    const { digest, manifest } = await resolveImage(skopeo, ref, name, log);
    if (options.maxBytes !== undefined && manifest.bytes !== undefined && manifest.bytes > options.maxBytes) {
      throw tooLarge(name, `its layers are ${manifest.bytes} bytes compressed`, options.maxBytes);
    }
    const layout = join(scratch, "layout");
    const config = await downloadImage(skopeo, ref.repository, manifest, layout, name, log);
    log("unpacking layers");
    await unpack(`${layout}:image`, staging, { deadline, timeoutMs, name });
    await rm(layout, { recursive: true, force: true });
    const prepared = await prepareRootfs(staging, {
      imageName: name,
      uidBase: options.uidBase,
      nodeBinary: options.nodeBinary ?? process.execPath,
      envdRoot: options.envdRoot ?? REPO_ROOT,
      onLog: log,
    });
    if (options.maxBytes !== undefined && prepared.bytes > options.maxBytes) {
      throw tooLarge(name, `its files take ${prepared.bytes} bytes unpacked`, options.maxBytes);
    }
    if (Date.now() > deadline) throw timeout(name, timeoutMs);
    await rename(staging, options.destRootfs);
    log(`rootfs ready (${(prepared.bytes / 1e6).toFixed(1)} MB) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    return { ref: formatImageRef(ref), digest, manifestDigest: manifest.digest, config, prepared };
  } catch (error) {
    if (error instanceof ImageError) throw error;
    throw new ImageError("failed", `preparing image '${name}' failed: ${(error as Error).message}`, { cause: error });
  } finally {
    await rm(staging, { recursive: true, force: true });
    await rm(scratch, { recursive: true, force: true });
  }
}

/** The digest the reference resolves to, and the manifest of this host's platform (from a list, if it is one). */
async function resolveImage(
  skopeo: Skopeo,
  ref: ImageRef,
  name: string,
  log: (line: string) => void,
): Promise<{ digest: string; manifest: ImageManifest }> {
  const topRaw = await skopeo.rawManifest(skopeo.source(ref.repository, ref.digest ? `@${ref.digest}` : `:${ref.tag}`));
  const digest = manifestDigest(topRaw);
  const platform = choosePlatform(topRaw, name);
  const raw = platform ? await skopeo.rawManifest(skopeo.source(ref.repository, `@${platform.digest}`)) : topRaw;
  const manifest = describeManifest(raw, name);
  const size = manifest.bytes === undefined ? "size unknown" : `${(manifest.bytes / 1e6).toFixed(1)} MB`;
  const which = platform ? ` (${hostPlatform()}: ${manifest.digest})` : "";
  log(`image ${digest}${which}: ${manifest.layers} layers, ${size}`);
  return { digest, manifest };
}

/** Copies the image (by its platform manifest's digest) into an OCI layout at `layout:image`; returns its config. */
async function downloadImage(
  skopeo: Skopeo,
  repository: string,
  manifest: ImageManifest,
  layout: string,
  name: string,
  log: (line: string) => void,
): Promise<ImageConfig> {
  await skopeo.copyToLayout(skopeo.source(repository, `@${manifest.digest}`), `${layout}:image`, {
    recompress: manifest.zstd,
    onLine: (line) => {
      if (/^Copying (blob|config)/.test(line)) log(line.trim());
    },
  });
  const { config, platform } = await readLayoutConfig(layout, name);
  if (platform !== hostPlatform()) {
    throw new ImageError("unsupported", `image '${name}' is built for ${platform}, this node runs ${hostPlatform()}`);
  }
  return config;
}

/** `umoci raw unpack`: the layers only, without the runtime bundle and mtree (a hash of every file) of `unpack`. */
async function unpack(
  image: string,
  rootfs: string,
  limits: { deadline: number; timeoutMs: number; name: string },
): Promise<void> {
  const remaining = limits.deadline - Date.now();
  if (remaining <= 0) throw timeout(limits.name, limits.timeoutMs);
  try {
    await exec("umoci", ["raw", "unpack", "--image", image, rootfs], { timeoutMs: remaining });
  } catch (error) {
    if (Date.now() >= limits.deadline - 50) throw timeout(limits.name, limits.timeoutMs);
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      throw new ImageError("failed", "umoci is not installed on this node (Debian package umoci)", { cause: error });
    }
    const detail = error instanceof ExecError ? error.result.stderr.trim().split("\n").pop() : String(error);
    throw new ImageError("failed", `unpacking image '${limits.name}' failed: ${detail}`, { cause: error });
  }
}

function tooLarge(name: string, what: string, maxBytes: number): ImageError {
  return new ImageError("too_large", `image '${name}' is too large: ${what}, the limit is ${maxBytes}`);
}

function timeout(name: string, timeoutMs: number): ImageError {
  return new ImageError("timeout", `pulling image '${name}' took longer than ${timeoutMs} ms`);
}
