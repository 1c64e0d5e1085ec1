import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { TemplateImage } from "../runtime/driver.js";
import { exec } from "../runtime/exec.js";
import { withFileLock } from "../runtime/file-lock.js";
import { TEMPLATE_RECIPES, type TemplateRecipe } from "./catalog.js";
import { diffRootfs, markCopyEnd, removeInside } from "./rootfs-diff.js";
import {
  type FetchedTemplate,
  isClaim,
  type LayeredPublish,
  type SharedTemplates,
  type TemplateBuildClaim,
} from "./sharing.js";
import { SHIPPED_BUILD_SPECS, type ShippedBuildSpec } from "./shipped-specs.js";
import { rebaseOwners, UID_RANGE } from "./uid-shift.js";

/** Bumped when the build procedure itself changes, so every cached template is rebuilt (2: from the builder). */
const BUILD_FORMAT = 2;

export interface BuiltTemplate extends TemplateImage {
  readonly recipe: TemplateRecipe;
  readonly dir: string;
}

export interface TemplateStoreOptions {
  /** Cache root, shared by every agent on the host: `<dir>/<id>-<hash>/{rootfs,manifest.json,READY}`. */
  readonly dir: string;
  readonly uidBase: number;
  readonly log: Logger;
  readonly recipes?: Readonly<Record<string, TemplateRecipe>>;
  /** The builder's specs of the recipes it makes (default: the shipped ones, shipped-specs.ts). */
  readonly specs?: Readonly<Record<string, ShippedBuildSpec>>;
  /**
   * The cluster's shared copies (sharing.ts): a template this node lacks is pulled when another node published it,
   * built here (and published) only by the node holding its claim. Absent: every node builds its own.
   */
  readonly shared?: SharedTemplates;
  /**
   * Asks the master's template builder for a template it has a spec for: called with the rootfs to make (must not
   * exist yet), already prepared and owned by the sandbox uid range; resolves with what goes into the manifest about
   * the build (node-agent/shipped-from-builder.ts). Absent (a driver that cannot take a build's layers, a store
   * opened by a tool): such a template comes only from this host's cache or the cluster's store.
   */
  readonly fromBuilder?: (id: string, rootfs: string, log: Logger) => Promise<Record<string, unknown>>;
  /** How often a node waiting for another node's build looks again (default 2 s). */
  readonly sharedPollMs?: number;
  /**
   * How long the current recipe's copy must have been in the store before the copies of earlier recipes of the
   * same template are removed (default a day: nodes not yet upgraded keep pulling theirs meanwhile).
   */
  readonly sharedGraceMs?: number;
}

/** Proves a freshly built template works: start a sandbox from it and wait for envd's /health. */
export type ReadyCheck = (image: TemplateImage) => Promise<void>;

/** A template the builder makes, asked for where nothing can ask the builder and no store holds it. */
export class TemplateUnavailableError extends Error {
  readonly code = "template_unavailable";
}

/**
 * The node's cache of its shipped templates, by content hash: each is made once (by the master's template builder
 * from its spec, or as a copy of its parent, or empty), pulled from the cluster's store instead where another node
 * published it, safe under concurrent agents (a file lock per template), and marked READY only after its ready
 * check passes.
 */
export class TemplateStore {
  private readonly recipes: Readonly<Record<string, TemplateRecipe>>;
  /** Templates found built here that were offered to the cluster's store (once per process), by id. */
  private readonly offered = new Map<string, Promise<void>>();

  constructor(private readonly options: TemplateStoreOptions) {
    this.recipes = options.recipes ?? TEMPLATE_RECIPES;
  }

  knows(id: string): boolean {
    return Object.hasOwn(this.recipes, id);
  }

  ids(): string[] {
    return Object.keys(this.recipes);
  }

  recipe(id: string): TemplateRecipe {
    const recipe = this.recipes[id];
    if (!recipe) throw new Error(`unknown template '${id}'`);
    return recipe;
  }

  hash(id: string): string {
    const recipe = this.recipe(id);
    const parentHash = recipe.parent ? this.hash(recipe.parent) : "";
    const builder = this.builderSpec(id);
    return createHash("sha256")
      .update(
        JSON.stringify({
          BUILD_FORMAT,
          uidBase: this.options.uidBase,
          parentHash,
          recipe,
          ...(builder ? { builder } : {}),
        }),
      )
      .digest("hex")
      .slice(0, 16);
  }

  /** The builder's spec of a template the master's builder makes; undefined for a copy or an empty one. */
  private builderSpec(id: string): ShippedBuildSpec | undefined {
    const specs: Readonly<Record<string, ShippedBuildSpec>> = this.options.specs ?? SHIPPED_BUILD_SPECS;
    return Object.hasOwn(specs, id) ? specs[id] : undefined;
  }

  /**
   * The template's name in the cluster's store: its id and a hash of its content without this node's uid base
   * (owners are moved into each node's range when it pulls).
   */
  sharedName(id: string): string {
    const recipe = this.recipe(id);
    const parent = recipe.parent ? this.sharedName(recipe.parent) : "";
    const builder = this.builderSpec(id);
    const key = createHash("sha256")
      .update(JSON.stringify({ BUILD_FORMAT, parent, recipe, ...(builder ? { builder } : {}) }))
      .digest("hex");
    return `${id}-${key.slice(0, 16)}`;
  }

  private templateDir(id: string): string {
    return join(this.options.dir, `${id}-${this.hash(id)}`);
  }

  /** The template if it is built and passed its ready check. */
  ready(id: string): BuiltTemplate | undefined {
    if (!this.knows(id)) return undefined;
    const dir = this.templateDir(id);
    return existsSync(join(dir, "READY")) ? this.image(id) : undefined;
  }

  private image(id: string): BuiltTemplate {
    const recipe = this.recipe(id);
    const dir = this.templateDir(id);
    return {
      templateId: id,
      hash: this.hash(id),
      rootfs: join(dir, "rootfs"),
      allowSetuid: recipe.allowSetuid,
      codeGateway: recipe.codeGateway === true,
      recipe,
      dir,
    };
  }

  /**
   * Makes `id` (and its parents) ready unless cached: pulled from the cluster's store when another node published
   * it, else built here (and then published, when this node holds the cluster's claim on it), then its ready check
   * runs once.
   */
  async ensure(id: string, readyCheck: ReadyCheck): Promise<BuiltTemplate> {
    const recipe = this.recipe(id);
    const cached = this.ready(id);
    if (cached) {
      void this.offer(id);
      return cached;
    }
    if (recipe.parent) await this.ensure(recipe.parent, readyCheck);
    const log = this.options.log.child({ templateId: id, hash: this.hash(id) });
    return withFileLock(join(this.options.dir, "locks", `${id}.lock`), async () => {
      const dir = this.templateDir(id);
      if (existsSync(join(dir, "READY"))) return this.image(id);
      let claim: TemplateBuildClaim | undefined;
      try {
        if (!existsSync(join(dir, "rootfs"))) {
          const source = this.options.shared && !recipe.empty ? await this.fromCluster(recipe, dir, log) : "build";
          if (source !== "pulled") {
            claim = source === "build" ? undefined : source;
            await this.build(recipe, dir, log);
          }
        } else log.info("template rootfs cached; running its ready check");
        const image = this.image(id);
        const started = Date.now();
        await readyCheck(image);
        if (claim) await this.publish(claim, image, log);
        await writeFile(join(dir, "READY"), new Date().toISOString());
        log.info("template ready", { readyCheckMs: Date.now() - started });
        return image;
      } finally {
        await claim?.release().catch(() => undefined);
      }
    });
  }

  /**
   * Pulls the template when the cluster's store has it; otherwise claims its build for the cluster, or waits while
   * another node holds that claim (its build ends in a publish, or its claim expires and this node takes it).
   */
  private async fromCluster(recipe: TemplateRecipe, dir: string, log: Logger): Promise<"pulled" | TemplateBuildClaim> {
    const shared = this.options.shared as SharedTemplates;
    const name = this.sharedName(recipe.id);
    let waitingFor: string | undefined;
    // A node whose driver cannot take a build's layers never claims what the builder makes: it waits for a copy.
    const canBuild = this.builderSpec(recipe.id) === undefined || this.options.fromBuilder !== undefined;
    let toldWaiting = false;
    for (;;) {
      if (await this.pull(recipe, dir, log)) return "pulled";
      if (!canBuild) {
        if (!toldWaiting) {
          toldWaiting = true;
          log.info("this node cannot have the template builder make the template; waiting for a copy in the store");
        }
        await new Promise((resolve) => setTimeout(resolve, this.options.sharedPollMs ?? 2000));
        continue;
      }
      const claim = await shared.claim(name);
      if (isClaim(claim)) {
        // Published between the look and the claim: that copy is the cluster's.
        if (!(await shared.has(name))) {
          log.info("building the template for the cluster", { store: shared.description, name });
          return claim;
        }
        await claim.release();
        continue;
      }
      if (waitingFor !== claim.holder) {
        waitingFor = claim.holder;
        log.info("another node is building the template; waiting for it in the store", { holder: claim.holder });
      }
      await new Promise((resolve) => setTimeout(resolve, this.options.sharedPollMs ?? 2000));
    }
  }

  /** Unpacks the store's copy into `dir` (owners moved into this node's range); false when the store lacks it. */
  private async pull(recipe: TemplateRecipe, dir: string, log: Logger): Promise<boolean> {
    const shared = this.options.shared as SharedTemplates;
    const name = this.sharedName(recipe.id);
    await mkdir(this.options.dir, { recursive: true });
    const tmp = `${dir}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp);
    const started = Date.now();
    try {
      const fetched = await this.unpack(recipe.id, name, join(tmp, "rootfs"), undefined, log);
      if (!fetched) {
        await rm(tmp, { recursive: true, force: true });
        return false;
      }
      await writeFile(
        join(tmp, "manifest.json"),
        JSON.stringify(
          {
            id: recipe.id,
            hash: this.hash(recipe.id),
            pulledAt: new Date().toISOString(),
            pulledFrom: { store: shared.description, name, digest: fetched.digest },
            recipe,
          },
          null,
          2,
        ),
      );
      await rm(dir, { recursive: true, force: true });
      await rename(tmp, dir);
      log.info("template pulled from the store", {
        store: shared.description,
        digest: fetched.digest,
        mib: Math.round(fetched.bytes / 2 ** 20),
        ...(fetched.layeredOn ? { layeredOn: fetched.layeredOn.name } : {}),
        seconds: Math.round((Date.now() - started) / 100) / 10,
      });
      return true;
    } catch (error) {
      await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
      throw error;
    }
  }

  /**
   * Unpacks the store's copy of template `id` (published as `name`) into `rootfs` with this node's owners. A copy
   * layered over its parent goes over this node's parent when that is the very copy it was layered on (same
   * digest), else over the store's copy of the parent, unpacked the same way.
   */
  private async unpack(
    id: string,
    name: string,
    rootfs: string,
    expectedDigest: string | undefined,
    log: Logger,
  ): Promise<FetchedTemplate | undefined> {
    const shared = this.options.shared as SharedTemplates;
    const uidBase = this.options.uidBase;
    const fetched = await shared.fetch(name, rootfs, async (over) => {
      const parentId = this.recipe(id).parent;
      if (!parentId || over.name !== this.sharedName(parentId)) {
        throw new Error(`template '${name}' in the store is layered on '${over.name}', which is not its parent's copy`);
      }
      const own = this.ready(parentId);
      if (own && (await this.provenance(parentId)).includes(over.digest)) {
        await exec("cp", ["-a", "--reflink=auto", own.rootfs, rootfs]);
      } else {
        log.info("this node's copy of the parent is not the one the template was layered on; unpacking that one", {
          parent: over.name,
          digest: over.digest,
        });
        if (!(await this.unpack(parentId, over.name, rootfs, over.digest, log))) {
          throw new Error(`template '${name}' is layered on '${over.name}', which the store no longer holds`);
        }
      }
      // Ranges that overlap cannot be told apart once the layer is in: the parent goes into the publisher's first.
      if (over.uidBase !== uidBase && Math.abs(over.uidBase - uidBase) < UID_RANGE) {
        await rebaseOwners(rootfs, uidBase, over.uidBase);
      }
      for (const path of over.deletions) await removeInside(rootfs, path);
    });
    if (!fetched) return undefined;
    if (expectedDigest && fetched.digest !== expectedDigest) {
      throw new Error(`template '${name}' in the store is ${fetched.digest} now, not ${expectedDigest}`);
    }
    // Over a parent in this node's range (a range apart from the publisher's), only the layer's entries move.
    if (fetched.uidBase !== uidBase) await rebaseOwners(rootfs, fetched.uidBase, uidBase);
    return fetched;
  }

  /**
   * The digests this node's copy of `id` is known by in a store: the one it was pulled as, and each it was
   * published as (a tree packed again may pack to other bytes).
   */
  private async provenance(id: string): Promise<string[]> {
    const manifest = (await this.manifest(id).catch(() => ({}))) as {
      published?: { digest: string }[];
      pulledFrom?: { digest?: string };
    };
    return [manifest.pulledFrom?.digest, ...(manifest.published ?? []).map((p) => p.digest)].filter(
      (digest): digest is string => typeof digest === "string",
    );
  }

  /**
   * A child template built here from a copy of its parent, when that parent is the store's copy: published as only
   * what changed since the copy (rootfs-diff.ts), so a node that has the parent moves just that.
   */
  private async layering(image: BuiltTemplate): Promise<LayeredPublish | undefined> {
    const parentId = image.recipe.parent;
    const shared = this.options.shared;
    if (!parentId || !shared) return undefined;
    const manifest = (await this.manifest(image.templateId).catch(() => ({}))) as { parentCopiedCtimeNs?: string };
    const parent = this.ready(parentId);
    if (!manifest.parentCopiedCtimeNs || !parent) return undefined;
    const name = this.sharedName(parentId);
    const digest = await shared.digest(name);
    if (!digest || !(await this.provenance(parentId)).includes(digest)) return undefined;
    const diff = await diffRootfs(parent.rootfs, image.rootfs, BigInt(manifest.parentCopiedCtimeNs));
    return { parent: { name, digest }, diff };
  }

  /**
   * Publishes a template this node built for the cluster. A failed publish leaves the template working here (it is
   * logged): the claim's release lets another node build its own.
   */
  private async publish(claim: TemplateBuildClaim, image: BuiltTemplate, log: Logger): Promise<void> {
    const started = Date.now();
    try {
      const layered = await this.layering(image);
      const published = await claim.publish(image.rootfs, this.options.uidBase, layered);
      const manifest = (await this.manifest(image.templateId)) as { published?: unknown[] };
      const written = join(image.dir, `manifest.json.tmp-${process.pid}`);
      const record = {
        store: this.options.shared?.description,
        digest: published.digest,
        bytes: published.bytes,
        ...(layered ? { layeredOn: layered.parent.name } : {}),
      };
      await writeFile(
        written,
        JSON.stringify({ ...manifest, published: [...(manifest.published ?? []), record] }, null, 2),
      );
      await rename(written, join(image.dir, "manifest.json"));
      log.info("template published to the store", {
        digest: published.digest,
        mib: Math.round(published.bytes / 2 ** 20),
        ...(layered ? { layeredOn: layered.parent.name, entries: layered.diff.entries.length } : {}),
        seconds: Math.round((Date.now() - started) / 100) / 10,
      });
    } catch (error) {
      log.warn("template could not be published to the store", { error: (error as Error).message });
    }
  }

  /**
   * A template found built here (before sharing was on, or while the store was unreachable) is published once
   * when the store lacks it, in the background, so nodes that join later pull it instead of building their own;
   * then the copies of its earlier recipes are collected (`sharedGraceMs` after this one was published). Once per
   * template and process: at an agent's start, for the templates it prebuilds. Resolves when that is done (what
   * fails is logged), with what was published recorded in the template's manifest (`published`).
   */
  offer(id: string): Promise<void> {
    const recipe = this.recipe(id);
    const shared = this.options.shared;
    const offered = this.offered.get(recipe.id);
    if (offered) return offered;
    if (!shared || recipe.empty) return Promise.resolve();
    const name = this.sharedName(recipe.id);
    const log = this.options.log.child({ templateId: recipe.id, hash: this.hash(recipe.id) });
    // The parent first: a child is published as its difference over the parent's copy in the store.
    const parent = recipe.parent && this.ready(recipe.parent) ? this.offer(recipe.parent) : undefined;
    const offering = (async () => {
      await parent;
      if (!(await shared.has(name))) {
        const claim = await shared.claim(name);
        if (!isClaim(claim)) return;
        try {
          const image = this.ready(recipe.id);
          if (image && !(await shared.has(name))) await this.publish(claim, image, log);
        } finally {
          await claim.release();
        }
      }
      const removed = await shared.collect(recipe.id, name, this.options.sharedGraceMs ?? 24 * 3600_000);
      if (removed.length > 0) log.info("earlier recipes' copies removed from the store", { removed });
    })().catch((error) => log.warn("template could not be offered to the store", { error: (error as Error).message }));
    this.offered.set(recipe.id, offering);
    return offering;
  }

  private async build(recipe: TemplateRecipe, dir: string, log: Logger): Promise<void> {
    const builder = this.builderSpec(recipe.id);
    if (!builder) return this.staged(recipe, dir, log, (tmp) => this.copyOfParent(recipe, tmp, log));
    const fromBuilder = this.options.fromBuilder;
    if (!fromBuilder) {
      throw new TemplateUnavailableError(
        `template '${recipe.id}' is made by the master's template builder, which this node cannot ask, and no ` +
          "store holds a copy: run a namespace node agent with a master once (`warren up`), or share the cluster's templates",
      );
    }
    // Made by the master's template builder, already prepared and owned by the sandbox uid range.
    return this.staged(recipe, dir, log, async (tmp) => {
      log.info("template build", { what: "asking the master's template builder for it" });
      const build = await fromBuilder(recipe.id, join(tmp, "rootfs"), log);
      return { manifest: { builder: { spec: builder, ...build } }, logged: { by: "template builder" } };
    });
  }

  /**
   * Makes the template in a staging folder next to `dir` (`make` fills its rootfs and says what goes into the
   * manifest and the log), writes the manifest, then renames it into place; a failure removes the staging folder.
   */
  private async staged(
    recipe: TemplateRecipe,
    dir: string,
    log: Logger,
    make: (tmp: string) => Promise<{ manifest: Record<string, unknown>; logged: Record<string, unknown> }>,
  ): Promise<void> {
    await mkdir(this.options.dir, { recursive: true });
    const tmp = `${dir}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp);
    const started = Date.now();
    try {
      const { manifest, logged } = await make(tmp);
      await writeFile(
        join(tmp, "manifest.json"),
        JSON.stringify(
          { id: recipe.id, hash: this.hash(recipe.id), builtAt: new Date().toISOString(), ...manifest, recipe },
          null,
          2,
        ),
      );
      await rm(dir, { recursive: true, force: true });
      await rename(tmp, dir);
      log.info("template built", { seconds: Math.round((Date.now() - started) / 100) / 10, ...logged });
    } catch (error) {
      await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
      throw error;
    }
  }

  /** A template without a spec: its parent's rootfs copied (owners already in this node's range), or empty. */
  private async copyOfParent(
    recipe: TemplateRecipe,
    tmp: string,
    log: Logger,
  ): Promise<{ manifest: Record<string, unknown>; logged: Record<string, unknown> }> {
    const rootfs = join(tmp, "rootfs");
    if (!recipe.parent) {
      await mkdir(rootfs);
      return { manifest: {}, logged: { empty: true } };
    }
    const parent = this.ready(recipe.parent);
    if (!parent) throw new Error(`parent template '${recipe.parent}' is not ready`);
    log.info("template build", { what: `copy ${recipe.parent} rootfs` });
    await exec("cp", ["-a", "--reflink=auto", parent.rootfs, rootfs]);
    // What changes from now on is newer (rootfs-diff.ts tells what to publish over the parent by it).
    const parentCopiedCtimeNs = await markCopyEnd(join(tmp, "parent-copied"));
    return { manifest: { parentCopiedCtimeNs: String(parentCopiedCtimeNs) }, logged: { copyOf: recipe.parent } };
  }

  /** Manifest of a built template (tests, diagnostics). */
  async manifest(id: string): Promise<Record<string, unknown>> {
    return JSON.parse(await readFile(join(this.templateDir(id), "manifest.json"), "utf8")) as Record<string, unknown>;
  }
}
