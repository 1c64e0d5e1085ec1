import { ImageError } from "./errors.js";

export const DOCKER_HUB = "docker.io";

/** An image reference, normalised as Docker normalises it (`ubuntu` → `docker.io/library/ubuntu:latest`). */
export interface ImageRef {
  /** `docker.io`, `ghcr.io`, `127.0.0.1:5000`, `[::1]:5000`. */
  readonly registry: string;
  /** `library/ubuntu`, `team/img`. */
  readonly repository: string;
  /** Absent only when the reference names a digest alone. */
  readonly tag?: string;
  /** `sha256:<64 hex>` (or sha512); when present it is what is pulled, the tag only documents. */
  readonly digest?: string;
}

// The grammar of github.com/distribution/reference (the one Docker uses).
const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const DOMAIN =
  /^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|\[[a-fA-F0-9:]+\])(?::[0-9]{1,5})?$/;
const TAG = /^[\w][\w.-]{0,127}$/;
const DIGESTS: Readonly<Record<string, number>> = { sha256: 64, sha512: 128 };
const MAX_NAME = 255;

function invalid(ref: string, why: string): ImageError {
  return new ImageError("invalid_ref", `invalid image reference '${ref}': ${why}`);
}

/**
 * Parses `[registry/]repository[:tag][@digest]`. The first path component is a registry when it has a `.` or a
 * `:`, is `localhost`, or has upper-case letters; otherwise the image is on Docker Hub, where a single-component
 * name is an official image (`library/`). No tag and no digest means `latest`.
 */
export function parseImageRef(ref: string): ImageRef {
  if (ref.length === 0) throw invalid(ref, "it is empty");
  if (ref !== ref.trim() || /\s/.test(ref)) throw invalid(ref, "it contains whitespace");
  if (ref.includes("://")) throw invalid(ref, "give the image name without a scheme (like 'ghcr.io/org/img:tag')");
  let rest = ref;
  let digest: string | undefined;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    const [algorithm = "", hex = "", ...extra] = digest.split(":");
    const length = DIGESTS[algorithm];
    if (length === undefined || extra.length > 0 || !new RegExp(`^[a-f0-9]{${length}}$`).test(hex)) {
      throw invalid(ref, `digest '${digest}' is not sha256:<64 hex digits> or sha512:<128 hex digits>`);
    }
  }
  let tag: string | undefined;
  const colon = rest.lastIndexOf(":");
  if (colon > rest.lastIndexOf("/")) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw invalid(ref, `tag '${tag}' is not a valid tag (letters, digits, '_', '.', '-'; max 128)`);
  }
  if (rest === "") throw invalid(ref, "the repository name is missing");
  let registry = DOCKER_HUB;
  let repository = rest;
  const slash = rest.indexOf("/");
  const first = slash >= 0 ? rest.slice(0, slash) : "";
  if (
    slash >= 0 &&
    (first.includes(".") || first.includes(":") || first === "localhost" || first !== first.toLowerCase())
  ) {
    registry = first;
    repository = rest.slice(slash + 1);
    if (!DOMAIN.test(registry)) throw invalid(ref, `registry '${registry}' is not a host name with an optional port`);
  }
  if (registry === "index.docker.io") registry = DOCKER_HUB;
  if (registry === DOCKER_HUB && !repository.includes("/")) repository = `library/${repository}`;
  for (const component of repository.split("/")) {
    if (component !== component.toLowerCase()) throw invalid(ref, "repository names must be lower-case");
    if (!PATH_COMPONENT.test(component)) {
      throw invalid(ref, `'${component}' is not a valid repository path component`);
    }
  }
  if (registry.length + 1 + repository.length > MAX_NAME) throw invalid(ref, `the name is longer than ${MAX_NAME}`);
  if (!tag && !digest) tag = "latest";
  return { registry, repository, ...(tag ? { tag } : {}), ...(digest ? { digest } : {}) };
}

/** The canonical form, `docker.io/library/ubuntu:22.04` (tag and digest when both were given). */
export function formatImageRef(ref: ImageRef): string {
  return `${ref.registry}/${ref.repository}${ref.tag ? `:${ref.tag}` : ""}${ref.digest ? `@${ref.digest}` : ""}`;
}

/** The host actually contacted: Docker Hub names go to the configured mirror when there is one. */
export function registryHost(ref: ImageRef, dockerHubMirror: string | undefined): string {
  return ref.registry === DOCKER_HUB && dockerHubMirror ? dockerHubMirror : ref.registry;
}
