import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { isSnapshotId } from "@warren/proto/redis";
import type { RuntimeDriver, SnapshotImage } from "../runtime/driver.js";
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
  readonly pulled: PulledImage;
  /** The pull's progress lines, for the build's log. */
  readonly log: string[];
}

/**
 * Pulls an OCI image, prepares its root filesystem for envd and keeps it as a files-only snapshot over the empty
 * `scratch` template (the base of a template built `fromImage`). Nothing is left on failure.
 */
export async function importImage(
  deps: { readonly driver: RuntimeDriver; readonly config: NodeAgentConfig; readonly log: Logger },
  /** The empty `scratch` template, built on first use (only once the request is known to be servable). */
  scratch: () => Promise<BuiltTemplate>,
  request: { readonly snapshotId: string; readonly image: string; readonly credentials: ImageCredentials | undefined },
): Promise<ImportedImage> {
  const { snapshotId, image, credentials } = request;
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
    const images = deps.config.images ?? { insecureRegistries: [], maxBytes: 8 * 2 ** 30 };
    const pulled = await pullImageRootfs({
      ref: image,
      ...(credentials ? { credentials } : {}),
      ...(images.dockerHubMirror ? { dockerHubMirror: images.dockerHubMirror } : {}),
      insecureRegistries: images.insecureRegistries,
      maxBytes: images.maxBytes,
      workDir,
      destRootfs: dest,
      uidBase: deps.config.uidBase,
      nodeBinary: deps.config.nodeBinary,
      envdRoot: deps.config.envdRoot,
      onLog: (line) => log.push(line),
    });
    const snapshot = await deps.driver.snapshotFromDirectory(snapshotId, base, dest, base.recipe.defaults);
    deps.log.info("image imported as a template base", { snapshotId, image: pulled.ref, digest: pulled.digest });
    return { snapshot, pulled, log };
  } catch (error) {
    if (error instanceof ImageError) throw new AgentError(IMAGE_ERROR_CODES[error.code], error.message);
    throw error instanceof AgentError
      ? error
      : new AgentError("internal", `importing image '${image}' failed: ${(error as Error).message}`);
  } finally {
    await rm(dest, { recursive: true, force: true });
  }
}
