import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { copyFile, link, mkdir, readdir, rename, rm, stat, utimes } from "node:fs/promises";
import { join } from "node:path";

/**
 * The packs a node fetched from or sent to a registry store (snapshot-packs.ts), by digest, so a pull fetches only
 * the packs it lacks: a sandbox's copy packed against its template's ready snapshot, pulled by a node that pulled
 * that template, brings its own new pack alone. Least recently used packs go once the cache passes its budget
 * (`WARREN_PACK_CACHE_MB`; 0 turns it off). A cached pack is checked against its digest each time it is used: a
 * damaged one is dropped and fetched again.
 */
export class PackCache {
  private prepared = false;

  constructor(
    private readonly dir: string,
    private readonly budgetBytes: number,
  ) {}

  /** Puts the cached pack at `target` (a hard link, else a copy); false when it is not cached (or was damaged). */
  async take(digest: string, target: string): Promise<boolean> {
    const cached = this.path(digest);
    if (!cached || this.budgetBytes <= 0) return false;
    try {
      if ((await sha256(cached)) !== digest) {
        await rm(cached, { force: true });
        return false;
      }
      await link(cached, target).catch(() => copyFile(cached, target));
      const now = new Date();
      await utimes(cached, now, now);
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw error;
    }
  }

  /** Keeps a checked pack file (linked, else copied), then trims the cache to its budget. */
  async keep(digest: string, file: string): Promise<void> {
    const cached = this.path(digest);
    if (!cached || this.budgetBytes <= 0) return;
    if (!this.prepared) {
      await mkdir(this.dir, { recursive: true });
      this.prepared = true;
    }
    await link(file, cached).catch(async (error: NodeJS.ErrnoException) => {
      if (error.code === "EEXIST") return;
      await copyFile(file, `${cached}.tmp`);
      await rename(`${cached}.tmp`, cached);
    });
    await this.trim();
  }

  private async trim(): Promise<void> {
    const entries = await Promise.all(
      (await readdir(this.dir)).map(async (name) => {
        const info = await stat(join(this.dir, name)).catch(() => undefined);
        return { name, size: info?.size ?? 0, used: info?.mtimeMs ?? 0 };
      }),
    );
    let total = entries.reduce((sum, entry) => sum + entry.size, 0);
    for (const entry of entries.sort((a, b) => a.used - b.used)) {
      if (total <= this.budgetBytes) break;
      await rm(join(this.dir, entry.name), { force: true });
      total -= entry.size;
    }
  }

  private path(digest: string): string | undefined {
    const match = /^sha256:([0-9a-f]{64})$/.exec(digest);
    return match ? join(this.dir, match[1] as string) : undefined;
  }
}

async function sha256(file: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const piece of createReadStream(file, { highWaterMark: 1 << 20 })) hash.update(piece as Buffer);
  return `sha256:${hash.digest("hex")}`;
}
