import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { isSnapshotId } from "@warren/proto/redis";
import type { RuntimeDriver, SnapshotImage } from "../runtime/driver.js";
import {
  type DebianSource,
  DebianSourceError,
  debianMirror,
  debianRootfs,
  mirrorForLog,
} from "../templates/debian-rootfs.js";
import { ImageError, type ImageErrorCode } from "../templates/oci/errors.js";
import { type ImageCredentials, type PulledImage, pullImageRootfs } from "../templates/oci/pull.js";
import type { BuiltTemplate } from "../templates/store.js";
import type { NodeAgentConfig } from "./config.js";
import { AgentError, type AgentErrorCode } from "./errors.js";
import type { Logger } from "./log.js";

/** How an image that cannot become a template base is answered. */
const IMAGE_ERROR_CODES: Record<ImageErrorCode, AgentErrorCode> = {
  invalid_ref: "invalid_argument",
  not_found: "not_found",
  unauthorized: "failed_precondition",
  too_large: "failed_precondition",
  unsupported: "failed_precondition",
  timeout: "unavailable",
  failed: "internal",
};

export interface ImportedImage {
  readonly snapshot: SnapshotImage;
  /** What the source resolved to: the normalised reference and its digest, and the image's config. */
  readonly resolved: string;
  readonly digest: string;
  readonly config: PulledImage["config"];
  /** The pull's progress lines, for the build's log. */
  readonly log: string[];
}

/** Where a template base comes from: an OCI image in a registry, or a Debian system made here (Warren's recipes). */
export type ImageSource =
  | { readonly image: string; readonly credentials: ImageCredentials | undefined }
  | { readonly debian: DebianSource };

/** A Debian base's config: Debian's default PATH, root, no working directory. */
const DEBIAN_CONFIG: PulledImage["config"] = {
  env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
  user: "",
  workdir: "",
  entrypoint: [],
  cmd: [],
};

/**
 * Pulls an OCI image (or makes a Debian system: debian-rootfs.ts), prepares its root filesystem for envd and keeps
 * it as a files-only snapshot over the empty `scratch` template (the base of a template built `fromImage`).
 * Nothing is left on failure.
 */
export async function importImage(
  deps: { readonly driver: RuntimeDriver; readonly config: NodeAgentConfig; readonly log: Logger },
  /** The empty `scratch` template, built on first use (only once the request is known to be servable). */
  scratch: () => Promise<BuiltTemplate>,
  request: { readonly snapshotId: string; readonly source: ImageSource },
): Promise<ImportedImage> {
  const { snapshotId, source } = request;
  const image = "image" in source ? source.image : `debian:${source.debian.suite}`;
  if (!deps.driver.snapshotFromDirectory) {
    throw new AgentError("unimplemented", `the ${deps.driver.name} driver cannot build templates from images`);
  }
  if (!isSnapshotId(snapshotId)) throw new AgentError("invalid_argument", `invalid snapshot id '${snapshotId}'`);
  const base = await scratch();
  const workDir = join(deps.config.stateDir, "image-work");
  const dest = join(workDir, `rootfs-${snapshotId}`);
  const log: string[] = [];
  try {
    await mkdir(workDir, { recursive: true });
    const imported =
      "debian" in source
        ? await debianBase(deps.config, source.debian, dest, log)
        : await imageRootfs(deps.config, source, workDir, dest, log);
    const snapshot = await deps.driver.snapshotFromDirectory(snapshotId, base, dest, base.recipe.defaults);
    deps.log.info("image imported as a template base", {
      snapshotId,
      image: imported.resolved,
      digest: imported.digest,
    });
    return { snapshot, ...imported, log };
  } catch (error) {
    if (error instanceof DebianSourceError) throw new AgentError("invalid_argument", error.message);
    if (error instanceof ImageError) throw new AgentError(IMAGE_ERROR_CODES[error.code], error.message);
    throw error instanceof AgentError
      ? error
      : new AgentError("internal", `importing image '${image}' failed: ${(error as Error).message}`);
  } finally {
    await rm(dest, { recursive: true, force: true });
  }
}

/** An OCI image pulled from its registry and prepared (oci/pull.ts). */
async function imageRootfs(
  config: NodeAgentConfig,
  source: { readonly image: string; readonly credentials: ImageCredentials | undefined },
  workDir: string,
  dest: string,
  log: string[],
): Promise<Pick<ImportedImage, "resolved" | "digest" | "config">> {
  const images = config.images ?? { insecureRegistries: [], maxBytes: 8 * 2 ** 30 };
  const pulled = await pullImageRootfs({
    ref: source.image,
    ...(source.credentials ? { credentials: source.credentials } : {}),
    ...(images.dockerHubMirror ? { dockerHubMirror: images.dockerHubMirror } : {}),
    insecureRegistries: images.insecureRegistries,
    maxBytes: images.maxBytes,
    workDir,
    destRootfs: dest,
    uidBase: config.uidBase,
    nodeBinary: config.nodeBinary,
    envdRoot: config.envdRoot,
    onLog: (line) => log.push(line),
  });
  return { resolved: pulled.ref, digest: pulled.digest, config: pulled.config };
}

/** A Debian system made by debootstrap on this node (debian-rootfs.ts), from the node's configured mirror. */
async function debianBase(
  config: NodeAgentConfig,
  source: DebianSource,
  dest: string,
  log: string[],
): Promise<Pick<ImportedImage, "resolved" | "digest" | "config">> {
  const made = await debianRootfs({
    source,
    mirror: debianMirror(source.suite, config.debianMirror),
    destRootfs: dest,
    uidBase: config.uidBase,
    nodeBinary: config.nodeBinary,
    envdRoot: config.envdRoot,
    onLog: (line) => log.push(line),
  });
  return {
    resolved: `debian:${source.suite} (debootstrap from ${mirrorForLog(made.mirror)})`,
    digest: made.digest,
    config: DEBIAN_CONFIG,
  };
}
