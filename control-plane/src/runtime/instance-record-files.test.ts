import { mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { InstanceRecordFiles } from "./instance-record-files.js";

interface Record {
  readonly instanceId: string;
  labels: { [name: string]: string };
  egress?: string;
}

const root = mkdtempSync(join(tmpdir(), "warren-records-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("InstanceRecordFiles.persist", () => {
  it("writes of one instance started together all succeed, and the file holds every change", async () => {
    const records = new InstanceRecordFiles<Record>(root);
    const record: Record = { instanceId: "i-concurrent", labels: { pooled: "1" } };
    mkdirSync(records.dir(record.instanceId), { recursive: true });
    // A create's two steps at once: its labels and its egress, each changing the record, then persisting it.
    const writes: Promise<void>[] = [];
    for (let i = 0; i < 20; i++) {
      record.labels = { ...record.labels, [`step${i}`]: String(i) };
      writes.push(records.persist(record));
      record.egress = `policy-${i}`;
      writes.push(records.persist(record));
    }
    await Promise.all(writes);
    const stored = await records.load(record.instanceId);
    expect(stored?.egress).toBe("policy-19");
    expect(Object.keys(stored?.labels ?? {})).toHaveLength(21);
    // No temporary file left behind.
    expect(readdirSync(records.dir(record.instanceId))).toEqual(["instance.json"]);
  });

  it("a failed write fails its caller alone; the next write of the instance still happens", async () => {
    const records = new InstanceRecordFiles<Record>(root);
    const record: Record = { instanceId: "i-missing-dir", labels: {} };
    const failed = records.persist(record); // its directory does not exist yet
    const next = records.persist(record);
    await expect(failed).rejects.toThrow(/ENOENT/);
    await expect(next).rejects.toThrow(/ENOENT/);
    mkdirSync(records.dir(record.instanceId), { recursive: true });
    record.labels = { sandboxId: "s1" };
    await records.persist(record);
    expect((await records.load(record.instanceId))?.labels).toEqual({ sandboxId: "s1" });
  });
});
