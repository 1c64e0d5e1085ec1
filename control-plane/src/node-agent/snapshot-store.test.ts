import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createLogger } from "./log.js";
import { SnapshotStore } from "./snapshot-store.js";

// The embedded store (an OCI layout directory): publish, list, pull with the digest checked, and unpublish with
// the blobs nothing else refers to removed. skopeo and umoci are the real tools (scripts/setup-host.sh).
const root = mkdtempSync(join(tmpdir(), "warren-store-"));
const store = new SnapshotStore(
  { url: `oci:${join(root, "store")}`, insecure: false },
  join(root, "work"),
  createLogger("snapshot-store-test", { level: "error" }),
);

afterAll(() => rmSync(root, { recursive: true, force: true }));

async function* bytes(text: string): AsyncIterable<Uint8Array> {
  yield Buffer.from(text);
}

async function collect(data: AsyncIterable<Uint8Array>): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of data) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks).toString();
}

const blobs = () => readdirSync(join(root, "store", "blobs", "sha256")).length;

describe("the OCI layout snapshot store", () => {
  it("lists nothing before the first publish", async () => {
    expect(await store.listPublished()).toEqual([]);
  });

  it("publishes, lists and pulls snapshots, each checked against its digest", async () => {
    const one = await store.publish("sone", bytes("first snapshot"), { kind: "test" });
    await store.publish("stwo", bytes("second snapshot"), { kind: "test" });
    expect((await store.listPublished()).sort()).toEqual(["sone", "stwo"]);
    expect(await store.pull("sone", one.digest, collect)).toBe("first snapshot");
    await expect(store.pull("stwo", one.digest, collect)).rejects.toThrow(/does not match the published/);
  });

  it("refuses a snapshot whose layer was changed in the store (the blob no longer matches its digest)", async () => {
    const published = await store.publish("stamper", bytes("original content"), { kind: "test" });
    // The store's own copy of the layer (skopeo may have compressed it: its blob name is not the published digest).
    const blob = (digest: string) => join(root, "store", "blobs", "sha256", digest.slice("sha256:".length));
    const index = JSON.parse(readFileSync(join(root, "store", "index.json"), "utf8")) as {
      manifests: { digest: string; annotations: Record<string, string> }[];
    };
    const entry = index.manifests.find((m) => m.annotations["org.opencontainers.image.ref.name"] === "stamper");
    const manifest = JSON.parse(readFileSync(blob(entry?.digest ?? ""), "utf8")) as { layers: { digest: string }[] };
    writeFileSync(blob(manifest.layers[0]?.digest ?? ""), "tampered content");
    await expect(store.pull("stamper", published.digest, collect)).rejects.toThrow(/digest|match/i);
    // Nothing of the failed pull is left in the node's work folder.
    expect(readdirSync(join(root, "work"))).toEqual([]);
    await store.unpublish("stamper");
  });

  it("unpublishing removes the tag and the blobs only it used, and is idempotent", async () => {
    const before = blobs();
    await store.unpublish("sone");
    expect(await store.listPublished()).toEqual(["stwo"]);
    // Its manifest, config and layer went; the other snapshot's stay.
    expect(blobs()).toBe(before - 3);
    await store.unpublish("sone");
    expect(await store.listPublished()).toEqual(["stwo"]);
    await expect(store.unpublish("../x")).rejects.toThrow(/not a snapshot id/);
  });
});
