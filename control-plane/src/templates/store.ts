import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "@warren/platform/log";
import type { TemplateImage } from "../runtime/driver.js";
import { exec } from "../runtime/exec.js";
import { withFileLock } from "../runtime/file-lock.js";
import { TEMPLATE_RECIPES, type TemplateRecipe } from "./catalog.js";
import { hostDebianMirror } from "./mirror.js";
import { shiftOwners } from "./uid-shift.js";

/** Bumped when the build procedure itself changes, so every cached template is rebuilt. */
const BUILD_FORMAT = 1;

export interface BuiltTemplate extends TemplateImage {
  readonly recipe: TemplateRecipe;
  readonly dir: string;
}

export interface TemplateStoreOptions {
  /** Cache root, shared by every agent on the host: `<dir>/<id>-<hash>/{rootfs,manifest.json,READY}`. */
  readonly dir: string;
  readonly uidBase: number;
  /** Debian mirror; default: the one apt on this host uses. */
  readonly mirror?: string;
  readonly log: Logger;
  readonly recipes?: Readonly<Record<string, TemplateRecipe>>;
}

/** Proves a freshly built template works: start a sandbox from it and wait for envd's /health. */
export type ReadyCheck = (image: TemplateImage) => Promise<void>;

/** Steps run in a private mount namespace, so nothing they mount (proc, dev) can leak into the host's. */
const STEP_RUNNER = `set -e
R="$1"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
exec chroot "$R" /bin/sh -c "$STEP"
`;

/**
 * Builds templates on the node without Docker and caches them by content hash. A build is incremental (a child
 * template starts from its parent's cached rootfs; an unchanged template is never rebuilt), shows progress in the
 * log, is safe under concurrent builders (a file lock per template), and is marked READY only after its ready
 * check passes.
 */
export class TemplateStore {
  private readonly recipes: Readonly<Record<string, TemplateRecipe>>;

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
    return createHash("sha256")
      .update(JSON.stringify({ BUILD_FORMAT, uidBase: this.options.uidBase, parentHash, recipe }))
      .digest("hex")
      .slice(0, 16);
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

  /** Builds `id` (and its parents) unless cached, then runs its ready check once. */
  async ensure(id: string, readyCheck: ReadyCheck): Promise<BuiltTemplate> {
    const recipe = this.recipe(id);
    const cached = this.ready(id);
    if (cached) return cached;
    if (recipe.parent) await this.ensure(recipe.parent, readyCheck);
    const log = this.options.log.child({ templateId: id, hash: this.hash(id) });
    return withFileLock(join(this.options.dir, "locks", `${id}.lock`), async () => {
      const dir = this.templateDir(id);
      if (existsSync(join(dir, "READY"))) return this.image(id);
      if (!existsSync(join(dir, "rootfs"))) await this.build(recipe, dir, log);
      else log.info("template rootfs cached; running its ready check");
      const image = this.image(id);
      const started = Date.now();
      await readyCheck(image);
      await writeFile(join(dir, "READY"), new Date().toISOString());
      log.info("template ready", { readyCheckMs: Date.now() - started });
      return image;
    });
  }

  private async build(recipe: TemplateRecipe, dir: string, log: Logger): Promise<void> {
    await mkdir(this.options.dir, { recursive: true });
    const tmp = `${dir}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp);
    const rootfs = join(tmp, "rootfs");
    const started = Date.now();
    const total = (recipe.debootstrap || recipe.parent ? 1 : 0) + recipe.steps.length + 1;
    let step = 0;
    const progress = (what: string) => log.info("template build", { step: `${++step}/${total}`, what });
    try {
      if (recipe.debootstrap) {
        const mirror =
          this.options.mirror ?? hostDebianMirror(recipe.debootstrap.suite) ?? "http://deb.debian.org/debian";
        progress(`debootstrap ${recipe.debootstrap.suite} minbase from ${mirror}`);
        await exec(
          "unshare",
          [
            "--mount",
            "--propagation",
            "private",
            "debootstrap",
            "--variant=minbase",
            `--include=${recipe.debootstrap.include.join(",")}`,
            recipe.debootstrap.suite,
            rootfs,
            mirror,
          ],
          {
            onLine: (line) => {
              // debootstrap's phases, not its per-package chatter.
              if (/^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) [a-z0-9]/.test(line)) return;
              if (line.trim()) log.info("debootstrap", { line: line.trim() });
            },
          },
        );
      } else if (recipe.parent) {
        const parent = this.ready(recipe.parent);
        if (!parent) throw new Error(`parent template '${recipe.parent}' is not ready`);
        progress(`copy ${recipe.parent} rootfs`);
        await exec("cp", ["-a", "--reflink=auto", parent.rootfs, rootfs]);
      }
      if (recipe.empty) await mkdir(rootfs);
      else await exec("cp", ["/etc/resolv.conf", join(rootfs, "etc", "resolv.conf")]);
      for (const s of recipe.steps) {
        progress(s.name);
        await exec("unshare", ["--mount", "--propagation", "private", "sh", "-c", STEP_RUNNER, "step", rootfs], {
          env: { STEP: s.run, DEBIAN_FRONTEND: "noninteractive" },
          onLine: (line) => log.debug("step output", { step: s.name, line }),
        });
      }
      if (!recipe.empty) await writeFile(join(rootfs, "etc", "resolv.conf"), "");
      progress("shift owners into the sandbox uid range");
      const changed = await shiftOwners(rootfs, this.options.uidBase);
      await writeFile(
        join(tmp, "manifest.json"),
        JSON.stringify(
          { id: recipe.id, hash: this.hash(recipe.id), builtAt: new Date().toISOString(), recipe },
          null,
          2,
        ),
      );
      await rm(dir, { recursive: true, force: true });
      await rename(tmp, dir);
      log.info("template built", { seconds: Math.round((Date.now() - started) / 100) / 10, shiftedFiles: changed });
    } catch (error) {
      await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
      throw error;
    }
  }

  /** Manifest of a built template (tests, diagnostics). */
  async manifest(id: string): Promise<Record<string, unknown>> {
    return JSON.parse(await readFile(join(this.templateDir(id), "manifest.json"), "utf8")) as Record<string, unknown>;
  }
}
