import { createHash, randomBytes } from "node:crypto";
import { createReadStream, existsSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { AgentError } from "./errors.js";
import type { RegistryClient } from "./registry-client.js";
import { MANIFEST_MEDIA_TYPE, mismatch, type PackStore } from "./snapshot-packs.js";

const REF_NAME = "org.opencontainers.image.ref.name";

interface LayoutIndex {
  schemaVersion: 2;
  manifests: { mediaType?: string; digest: string; size?: number; annotations?: Record<string, string> }[];
}

/**
 * An OCI layout directory as snapshot-packs.ts writes it: blobs written under a hidden name at its root and
 * renamed (never a half-written blob), the tag added to index.json last. The caller holds the layout's lock
 * (OciStore), so a collection (`umoci gc`) never runs between a pack found present and the manifest naming it.
 */
export class LayoutPackStore implements PackStore {
  private prepared = false;

  constructor(private readonly layout: string) {}

  get scratchDir(): string {
    return this.layout;
  }

  async hasBlob(digest: string): Promise<boolean> {
    return existsSync(this.blobPath(digest));
  }

  async putBlob(digest: string, data: Buffer): Promise<void> {
    await this.prepare();
    await this.writeAtomically(this.blobPath(digest), data);
  }

  async putBlobFile(digest: string, file: string, _size: number): Promise<void> {
    await this.prepare();
    await rename(file, this.blobPath(digest));
  }

  async putManifest(tag: string, manifest: Buffer): Promise<void> {
    const digest = `sha256:${createHash("sha256").update(manifest).digest("hex")}`;
    if (!(await this.hasBlob(digest))) await this.putBlob(digest, manifest);
    const index = await this.readIndex();
    index.manifests = index.manifests.filter((entry) => entry.annotations?.[REF_NAME] !== tag);
    index.manifests.push({
      mediaType: MANIFEST_MEDIA_TYPE,
      digest,
      size: manifest.length,
      annotations: { [REF_NAME]: tag },
    });
    await this.writeAtomically(join(this.layout, "index.json"), Buffer.from(JSON.stringify(index)));
  }

  async getManifest(tag: string): Promise<Buffer | undefined> {
    const entry = (await this.readIndex()).manifests.find((m) => m.annotations?.[REF_NAME] === tag);
    if (!entry) return undefined;
    const manifest = await readFile(this.blobPath(entry.digest));
    if (`sha256:${createHash("sha256").update(manifest).digest("hex")}` !== entry.digest) throw mismatch(tag);
    return manifest;
  }

  async *readBlob(digest: string): AsyncIterable<Buffer> {
    yield* createReadStream(this.blobPath(digest), { highWaterMark: 1 << 20 });
  }

  localBlob(digest: string): string {
    return this.blobPath(digest);
  }

  /** The layout exists (its root holds the packs being written). */
  async prepare(): Promise<void> {
    if (this.prepared) return;
    await mkdir(join(this.layout, "blobs", "sha256"), { recursive: true });
    if (!existsSync(join(this.layout, "oci-layout"))) {
      await this.writeAtomically(
        join(this.layout, "oci-layout"),
        Buffer.from(JSON.stringify({ imageLayoutVersion: "1.0.0" })),
      );
    }
    this.prepared = true;
  }

  private async readIndex(): Promise<LayoutIndex> {
    try {
      return JSON.parse(await readFile(join(this.layout, "index.json"), "utf8")) as LayoutIndex;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return { schemaVersion: 2, manifests: [] };
      throw error;
    }
  }

  /** Written at the layout's root under a hidden name, then renamed into place. */
  private async writeAtomically(target: string, data: Buffer): Promise<void> {
    const tmp = join(this.layout, `.incoming-${randomBytes(6).toString("hex")}`);
    try {
      await writeFile(tmp, data);
      await rename(tmp, target);
    } catch (error) {
      await rm(tmp, { force: true });
      throw error;
    }
  }

  private blobPath(digest: string): string {
    const match = /^sha256:([0-9a-f]{64})$/.exec(digest);
    if (!match) throw new AgentError("internal", `the store answered an invalid digest '${digest}'`);
    return join(this.layout, "blobs", "sha256", match[1] as string);
  }
}

/** A registry repository through the distribution API (registry-client.ts); packs are written in `scratchDir`. */
export class RegistryPackStore implements PackStore {
  constructor(
    private readonly client: RegistryClient,
    readonly scratchDir: string,
  ) {}

  hasBlob(digest: string): Promise<boolean> {
    return this.client.hasBlob(digest);
  }

  putBlob(digest: string, data: Buffer): Promise<void> {
    return this.client.putBlob(digest, data);
  }

  putBlobFile(digest: string, file: string, size: number): Promise<void> {
    return this.client.putBlob(digest, { file, size });
  }

  putManifest(tag: string, manifest: Buffer): Promise<void> {
    return this.client.putManifest(tag, manifest, MANIFEST_MEDIA_TYPE);
  }

  getManifest(tag: string): Promise<Buffer | undefined> {
    return this.client.getManifest(tag, MANIFEST_MEDIA_TYPE);
  }

  async *readBlob(digest: string): AsyncIterable<Buffer> {
    yield* await this.client.getBlob(digest);
  }

  async prepare(): Promise<void> {
    await mkdir(this.scratchDir, { recursive: true });
  }
}
