import { mkdtempSync, readdirSync, rmSync } from "node:fs";
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
