import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { withCurrentResourceNames } from "./driver.js";
import { type CommonInstanceRecord, InstanceRecordFiles } from "./instance-record-files.js";

describe("resources written by an earlier Warren (memoryMiB, diskMiB)", () => {
  it("read back with today's names (memoryMB, diskSizeMB), the same mebibytes; today's records pass unchanged", () => {
    const old = { snapshotId: "s1", resources: { cpuCount: 1, memoryMiB: 512, diskMiB: 1024, pidsMax: 1024 } };
    expect(withCurrentResourceNames(old)).toEqual({
      snapshotId: "s1",
      resources: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 },
    });
    const current = { resources: { cpuCount: 2, memoryMB: 256, diskSizeMB: 128, pidsMax: 64 } };
    expect(withCurrentResourceNames(current)).toBe(current);
    expect(withCurrentResourceNames(undefined)).toBeUndefined();
  });

  it("an instance record from before the rename loads with today's names", async () => {
    const root = await mkdtemp(join(tmpdir(), "warren-records-"));
    try {
      const records = new InstanceRecordFiles<CommonInstanceRecord & { resources: Record<string, number> }>(root);
      await mkdir(join(root, "iold"));
      await records.persist({
        instanceId: "iold",
        resources: { cpuCount: 1, memoryMiB: 512, diskMiB: 1024, pidsMax: 1024 },
      } as unknown as CommonInstanceRecord & { resources: Record<string, number> });
      expect((await records.load("iold"))?.resources).toEqual({
        cpuCount: 1,
        memoryMB: 512,
        diskSizeMB: 1024,
        pidsMax: 1024,
      });
      await writeFile(join(root, "iold", "instance.json"), "not json");
      expect(await records.load("iold")).toBeUndefined();
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
