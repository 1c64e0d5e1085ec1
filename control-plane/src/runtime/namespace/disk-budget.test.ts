import { mkdtemp, rm, statfs, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DiskBudget, DiskBudgetExceeded } from "./disk-budget.js";

const MiB = 2 ** 20;

describe("DiskBudget", () => {
  let dir = "";
  let free = 0;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "warren-disk-budget-"));
    const fs = await statfs(dir);
    free = fs.bavail * fs.bsize;
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("counts what each promised image may still take: its size less the blocks it holds (sparse files hold none)", async () => {
    // The ratio turns this host's free space into a 100 MiB budget.
    const budget = new DiskBudget(dir, (100 * MiB) / free);
    const sparse = join(dir, "sparse.img");
    await truncate(sparse, 0).catch(() => writeFile(sparse, ""));
    await truncate(sparse, 60 * MiB);
    const promised = [{ image: sparse, sizeBytes: 60 * MiB }];
    await budget.admit(30 * MiB, promised);
    await expect(budget.admit(50 * MiB, promised)).rejects.toBeInstanceOf(DiskBudgetExceeded);
    // What the node is short of (60 + 50 - 100 MiB, give or take the free space's drift): the room a warm pool's
    // idle sandboxes are asked to give back (node-agent/sandbox-creation.ts).
    const short = await budget.admit(50 * MiB, promised).catch((error: DiskBudgetExceeded) => error.diskShortMB);
    expect(short).toBeGreaterThanOrEqual(9);
    expect(short).toBeLessThanOrEqual(11);
    // An image not made yet may take all of its size.
    await expect(
      budget.admit(30 * MiB, [...promised, { image: join(dir, "none.img"), sizeBytes: 20 * MiB }]),
    ).rejects.toThrow(/cannot promise a 30 MiB sandbox disk: \d+ MiB free, 80 MiB already promised/);
    // 40 MiB written into the image are on the disk already: only 20 MiB of it are still owed.
    const full = join(dir, "written.img");
    await writeFile(full, Buffer.alloc(40 * MiB, 1));
    await truncate(full, 60 * MiB);
    await budget.admit(50 * MiB, [{ image: full, sizeBytes: 60 * MiB }]);
  });

  it("a ratio above 1 promises more than is free; 0 or less is refused", async () => {
    await new DiskBudget(dir, 2).admit(free * 1.5, []);
    await expect(new DiskBudget(dir, 1).admit(free * 1.5, [])).rejects.toBeInstanceOf(DiskBudgetExceeded);
    expect(() => new DiskBudget(dir, 0)).toThrow(/positive ratio/);
  });
});
