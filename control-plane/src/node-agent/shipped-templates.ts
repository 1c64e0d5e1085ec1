import { randomBytes } from "node:crypto";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import {
  CLAIM_RELEASE_SCRIPT,
  CLAIM_RENEW_SCRIPT,
  TEMPLATE_BUILD_CLAIM_TTL_MS,
  templateBuildClaimKey,
} from "@warren/proto/redis";
import { Redis } from "ioredis";
import { TAR_KEEP, tarCreateStream, tarExtractStream } from "../runtime/tar-stream.js";
import type { FetchedTemplate, ParentOfLayer, SharedTemplates, TemplateBuildClaim } from "../templates/sharing.js";
import { AgentError } from "./errors.js";
import { OciStore, type OciStoreConfig } from "./oci-store.js";

/** Tags of shipped templates in the store; never a snapshot's (snapshot-store.ts leaves them out of its lists). */
export const SHIPPED_TEMPLATE_TAG_PREFIX = "template.";
const NAME_LABEL = "dev.warren.template";
const UID_BASE_LABEL = "dev.warren.template.uid-base";
/** A copy published as a difference over its parent: the parent's name and digest in the store. */
const PARENT_LABEL = "dev.warren.template.parent";
const PARENT_DIGEST_LABEL = "dev.warren.template.parent-digest";
/** A layered copy's parent's paths to delete before it goes over it (a JSON array; usually empty). */
const DELETIONS_LABEL = "dev.warren.template.deletions";
const DIGEST = /^sha256:[0-9a-f]{64}$/;

interface ClaimCommands {
  warrenRenewClaim(key: string, token: string, ttlMs: number): Promise<number>;
  warrenReleaseClaim(key: string, token: string): Promise<number>;
}

export interface StoreSharedTemplatesOptions {
  readonly store: OciStoreConfig;
  /** Scratch space for pulls from a registry. */
  readonly workDir: string;
  readonly redisUrl: string;
  readonly redisPrefix: string;
  readonly nodeId: string;
}

/**
 * The shipped templates' side of the cluster's template store (templates/sharing.ts): a template's root filesystem
 * as one uncompressed tar layer tagged `template.<id>-<key>` (its digest the image's diff_id, the publisher's uid
 * base a label), and the build claims in Redis, so one node builds each template for the cluster.
 */
export class StoreSharedTemplates implements SharedTemplates {
  private readonly oci: OciStore;
  private readonly redis: Redis & ClaimCommands;

  constructor(private readonly options: StoreSharedTemplatesOptions) {
    this.oci = new OciStore(options.store, options.workDir);
    const redis = new Redis(options.redisUrl, {
      lazyConnect: true,
      maxRetriesPerRequest: 3,
      keyPrefix: options.redisPrefix,
    });
    // Failures surface on the commands (the template's ensure fails and is retried by the next create).
    redis.on("error", () => undefined);
    redis.defineCommand("warrenRenewClaim", { numberOfKeys: 1, lua: CLAIM_RENEW_SCRIPT });
    redis.defineCommand("warrenReleaseClaim", { numberOfKeys: 1, lua: CLAIM_RELEASE_SCRIPT });
    this.redis = redis as Redis & ClaimCommands;
  }

  get description(): string {
    return this.oci.description;
  }

  async has(name: string): Promise<boolean> {
    return (await this.published(name)) !== undefined;
  }

  async digest(name: string): Promise<string | undefined> {
    return (await this.published(name))?.digest;
  }

  /** The published copy's digest, uid base and parent, from its image config; undefined when the store lacks it. */
  private async published(
    name: string,
  ): Promise<{ digest: string; uidBase: number; parent?: ParentOfLayer } | undefined> {
    const config = await this.oci.readConfig(tagOf(name));
    if (!config) return undefined;
    const labels = config.config?.Labels ?? {};
    const digest = config.rootfs?.diff_ids?.[0] ?? "";
    const uidBase = Number(labels[UID_BASE_LABEL]);
    const parentName = labels[PARENT_LABEL];
    const parentDigest = labels[PARENT_DIGEST_LABEL] ?? "";
    const deletions = parentName === undefined ? [] : parseDeletions(labels[DELETIONS_LABEL]);
    if (
      labels[NAME_LABEL] !== name ||
      !DIGEST.test(digest) ||
      !Number.isSafeInteger(uidBase) ||
      (parentName !== undefined && (!DIGEST.test(parentDigest) || !deletions))
    ) {
      throw new AgentError(
        "failed_precondition",
        `'${tagOf(name)}' in the store (${this.description}) is not a Warren template: remove it from the store`,
      );
    }
    if (parentName === undefined) return { digest, uidBase };
    return { digest, uidBase, parent: { name: parentName, digest: parentDigest, deletions: deletions ?? [], uidBase } };
  }

  async fetch(
    name: string,
    rootfs: string,
    overParent?: (parent: ParentOfLayer) => Promise<void>,
  ): Promise<FetchedTemplate | undefined> {
    const published = await this.published(name);
    if (!published) return undefined;
    const parent = published.parent;
    if (parent && !overParent) {
      throw new AgentError("failed_precondition", `template '${name}' in the store is layered on '${parent.name}'`);
    }
    return this.oci.inScratch("template-pull", async (scratch) => {
      const reader = await this.oci.openLayer(tagOf(name), scratch);
      try {
        if (parent && overParent) await overParent(parent);
        else await mkdir(rootfs);
        await tarExtractStream(
          [...TAR_KEEP, "--same-owner", "--same-permissions", "-C", rootfs],
          reader.pieces(),
          `template '${name}'`,
        );
        const read = await reader.finish();
        if (read.digest !== published.digest) {
          throw new AgentError(
            "failed_precondition",
            `template '${name}' in the store (${this.description}) does not match its digest ${published.digest} ` +
              `(read ${read.digest}): remove it from the store so that a node builds it again`,
          );
        }
        return {
          digest: published.digest,
          bytes: read.size,
          uidBase: published.uidBase,
          ...(parent ? { layeredOn: parent } : {}),
        };
      } catch (error) {
        throw this.oci.failure(error);
      } finally {
        await reader.close();
      }
    });
  }

  async claim(name: string): Promise<TemplateBuildClaim | { readonly holder: string }> {
    const key = templateBuildClaimKey(name);
    const token = `${this.options.nodeId}/${randomBytes(6).toString("hex")}`;
    await this.connect();
    const taken = await this.redis.set(key, token, "PX", TEMPLATE_BUILD_CLAIM_TTL_MS, "NX");
    if (taken !== "OK") return { holder: ((await this.redis.get(key)) ?? "another node").split("/")[0] as string };
    // Kept alive while this node builds (minutes for a debootstrap) and publishes.
    const renew = setInterval(() => {
      void this.redis.warrenRenewClaim(key, token, TEMPLATE_BUILD_CLAIM_TTL_MS).catch(() => undefined);
    }, TEMPLATE_BUILD_CLAIM_TTL_MS / 3);
    renew.unref();
    let released = false;
    return {
      publish: async (rootfs, uidBase, layered) => {
        const labels = { [NAME_LABEL]: name, [UID_BASE_LABEL]: String(uidBase) };
        if (!layered) {
          const ref = await this.oci.push(
            tagOf(name),
            tarCreateStream([...TAR_KEEP, "-C", rootfs, "."], `template '${name}'`),
            () => labels,
          );
          return { digest: ref.digest, bytes: ref.size };
        }
        return this.oci.inScratch("template-diff", async (scratch) => {
          await writeFile(join(scratch, "entries"), layered.diff.entries.map((p) => `${p}\0`).join(""));
          const ref = await this.oci.push(
            tagOf(name),
            tarCreateStream(
              [...TAR_KEEP, "--no-recursion", "-C", rootfs, "--null", `--files-from=${join(scratch, "entries")}`],
              `template '${name}' over '${layered.parent.name}'`,
            ),
            () => ({
              ...labels,
              [PARENT_LABEL]: layered.parent.name,
              [PARENT_DIGEST_LABEL]: layered.parent.digest,
              [DELETIONS_LABEL]: JSON.stringify(layered.diff.deletions),
            }),
          );
          return { digest: ref.digest, bytes: ref.size };
        });
      },
      release: async () => {
        if (released) return;
        released = true;
        clearInterval(renew);
        await this.redis.warrenReleaseClaim(key, token);
      },
    };
  }

  async collect(id: string, current: string, graceMs: number): Promise<string[]> {
    const published = Date.parse((await this.oci.readConfig(tagOf(current)))?.created ?? "");
    if (!Number.isFinite(published) || Date.now() - published < graceMs) return [];
    const stale = (await this.oci.listTags()).filter(
      (tag) =>
        tag.startsWith(tagOf(`${id}-`)) &&
        tag !== tagOf(current) &&
        /^[0-9a-f]{16}$/.test(tag.slice(tagOf(`${id}-`).length)),
    );
    if (stale.length > 0) await this.oci.remove(stale);
    return stale.map((tag) => tag.slice(SHIPPED_TEMPLATE_TAG_PREFIX.length));
  }

  private async connect(): Promise<void> {
    if (this.redis.status === "wait" || this.redis.status === "end") await this.redis.connect();
  }

  async close(): Promise<void> {
    await this.redis.quit().catch(() => this.redis.disconnect());
  }
}

function tagOf(name: string): string {
  return `${SHIPPED_TEMPLATE_TAG_PREFIX}${name}`;
}

/** A layered copy's deletions label: a JSON array of relative paths; undefined when it is not one. */
function parseDeletions(label: string | undefined): string[] | undefined {
  try {
    const value: unknown = JSON.parse(label ?? "");
    return Array.isArray(value) && value.every((p) => typeof p === "string") ? value : undefined;
  } catch {
    return undefined;
  }
}
