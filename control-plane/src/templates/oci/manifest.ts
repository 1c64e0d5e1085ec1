import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { ImageError } from "./errors.js";

/** The image's runtime settings (its config's `config` object), as a template build uses them. */
export interface ImageConfig {
  /** `NAME=value` entries. */
  readonly env: string[];
  /** `name`, `uid`, `uid:gid` or empty (root). */
  readonly user: string;
  /** Empty: `/`. */
  readonly workdir: string;
  readonly entrypoint: string[];
  readonly cmd: string[];
}

/** One platform's manifest: what to download, and how big it is. */
export interface ImageManifest {
  readonly digest: string;
  /** Compressed size of the layers and config; undefined for schema-1 manifests, which carry no sizes. */
  readonly bytes: number | undefined;
  readonly layers: number;
  readonly zstd: boolean;
}

/** A manifest list or index: the digest of this platform's image in it. */
export interface PlatformChoice {
  readonly digest: string;
}

const GO_ARCH: Readonly<Record<string, string>> = { x64: "amd64", arm64: "arm64" };

export function hostPlatform(): string {
  return `linux/${GO_ARCH[process.arch] ?? process.arch}`;
}

export function manifestDigest(raw: string): string {
  return `sha256:${createHash("sha256").update(raw, "utf8").digest("hex")}`;
}

interface RawManifest {
  readonly schemaVersion?: number;
  readonly mediaType?: string;
  readonly manifests?: readonly { digest?: string; platform?: { os?: string; architecture?: string } }[];
  readonly config?: { size?: number };
  readonly layers?: readonly { mediaType?: string; size?: number }[];
  readonly fsLayers?: readonly unknown[];
}

function parse(raw: string, imageName: string): RawManifest {
  try {
    const value = JSON.parse(raw) as unknown;
    if (value && typeof value === "object") return value as RawManifest;
  } catch {}
  throw new ImageError("failed", `the registry's manifest of image '${imageName}' is not JSON`);
}

/**
 * For a manifest list / OCI index: the entry for this host's platform (linux/amd64 on x86-64), skipping the
 * `unknown/unknown` attestation entries BuildKit adds. Undefined when `raw` is a single image's manifest.
 */
export function choosePlatform(raw: string, imageName: string): PlatformChoice | undefined {
  const manifest = parse(raw, imageName);
  if (!Array.isArray(manifest.manifests)) return undefined;
  const wanted = hostPlatform();
  const platforms = manifest.manifests.map((m) => `${m.platform?.os ?? "?"}/${m.platform?.architecture ?? "?"}`);
  const index = platforms.indexOf(wanted);
  const digest = index >= 0 ? manifest.manifests[index]?.digest : undefined;
  if (!digest) {
    const offered = [...new Set(platforms.filter((p) => p !== "unknown/unknown"))].join(", ") || "none";
    throw new ImageError("unsupported", `image '${imageName}' has no ${wanted} variant (it has: ${offered})`);
  }
  return { digest };
}

export function describeManifest(raw: string, imageName: string): ImageManifest {
  const manifest = parse(raw, imageName);
  const digest = manifestDigest(raw);
  if (manifest.schemaVersion === 1) {
    return { digest, bytes: undefined, layers: manifest.fsLayers?.length ?? 0, zstd: false };
  }
  if (!Array.isArray(manifest.layers)) {
    throw new ImageError("failed", `the registry's manifest of image '${imageName}' lists no layers`);
  }
  const sizes = [manifest.config?.size ?? 0, ...manifest.layers.map((l) => l.size ?? 0)];
  return {
    digest,
    bytes: sizes.reduce((a, b) => a + b, 0),
    layers: manifest.layers.length,
    zstd: manifest.layers.some((l) => l.mediaType?.includes("zstd")),
  };
}

/** The config of the single image in an OCI layout written by skopeo. */
export async function readLayoutConfig(
  layout: string,
  imageName: string,
): Promise<{ config: ImageConfig; platform: string }> {
  const blob = async (digest: string | undefined) => {
    const [algorithm, hex] = (digest ?? "").split(":");
    if (!algorithm || !hex || !/^[a-z0-9]+$/.test(algorithm) || !/^[a-f0-9]+$/.test(hex)) {
      throw new ImageError("failed", `image '${imageName}': bad digest '${digest}' in its OCI layout`);
    }
    return JSON.parse(await readFile(join(layout, "blobs", algorithm, hex), "utf8")) as Record<string, unknown>;
  };
  const index = JSON.parse(await readFile(join(layout, "index.json"), "utf8")) as {
    manifests?: { digest?: string }[];
  };
  const manifest = (await blob(index.manifests?.[0]?.digest)) as { config?: { digest?: string } };
  const image = (await blob(manifest.config?.digest)) as {
    os?: string;
    architecture?: string;
    config?: { Env?: unknown; User?: unknown; WorkingDir?: unknown; Entrypoint?: unknown; Cmd?: unknown };
  };
  const c = image.config ?? {};
  const strings = (v: unknown) => (Array.isArray(v) ? v.filter((s): s is string => typeof s === "string") : []);
  const string = (v: unknown) => (typeof v === "string" ? v : "");
  return {
    config: {
      env: strings(c.Env),
      user: string(c.User),
      workdir: string(c.WorkingDir),
      entrypoint: strings(c.Entrypoint),
      cmd: strings(c.Cmd),
    },
    platform: `${image.os ?? "linux"}/${image.architecture ?? GO_ARCH[process.arch]}`,
  };
}
